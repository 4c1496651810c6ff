GO ?= go
GOFLAGS_TEST ?= -race -count=1

.PHONY: run test build vet clean proto tools bench bench-micro fuzz accuracy

## run: serve the example config on the embedded store (gRPC :8081, HTTP :8080, admin localhost:9090)
run:
	$(GO) run ./cmd/ratelimit --config examples/config --log-format console --admin-addr localhost:9090

## test: vet and every test, with the race detector (needs redis-server on PATH
## and the code generators of `make tools`, for the generated-code check)
test: vet
	$(GO) test $(GOFLAGS_TEST) ./...

build:
	CGO_ENABLED=0 $(GO) build -o bin/ratelimit ./cmd/ratelimit

vet:
	$(GO) vet ./...

clean:
	rm -rf bin

## proto: regenerate the Go code of proto/**/*.proto (generators: make tools)
proto:
	proto/generate.sh

## tools: install protoc and the protoc plugins at the pinned versions
tools:
	.ci/tools.sh

## bench: load-test the service at its shipped defaults on a real redis-server, with
## Envoy's 20 ms deadline, against an INCRBY+EXPIRE floor: 54 scenarios of 6 s;
## BENCH_QUICK=1: a representative subset (< 1 min); BENCH_FLAGS: more flags (docs/bench.md)
bench:
	$(GO) run ./cmd/ratelimit-bench $(BENCH_FLAGS)

## bench-micro: the Go micro-benchmarks, with allocations
bench-micro:
	$(GO) test -run '^$$' -bench . -benchmem ./pkg/config ./pkg/limiter ./pkg/service ./pkg/grpcunary

FUZZTIME ?= 30s
FUZZFLAGS ?= -fuzztime=$(FUZZTIME) -fuzzminimizetime=5s

## fuzz: run each fuzz target for FUZZTIME (crashers are written to testdata/fuzz/)
fuzz:
	$(GO) test -run='^$$' -fuzz='^FuzzParse$$' $(FUZZFLAGS) ./pkg/config
	$(GO) test -run='^$$' -fuzz='^FuzzMatch$$' $(FUZZFLAGS) ./pkg/config
	$(GO) test -run='^$$' -fuzz='^FuzzKeyInjective$$' $(FUZZFLAGS) ./pkg/limiter

## accuracy: each algorithm against an exact sliding window (see docs/accuracy.md)
accuracy:
	$(GO) run ./cmd/ratelimit-sim -trace all
