GO ?= go
GOFLAGS_TEST ?= -race -count=1

.PHONY: run test build vet clean proto tools bench bench-attacks bench-micro fuzz accuracy

## run: serve the example config on the embedded store (gRPC :8081, HTTP :8080, admin localhost:9090)
run:
	$(GO) run ./cmd/ratelimit --config examples/config --log-format console --admin-addr localhost:9090

## test: vet and every test, with the race detector (needs redis-server on PATH,
## and the tools of `make tools`: the code generators, for the generated-code
## check, and h2spec, for internal/grpcunary's HTTP/2 conformance test)
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

## tools: install protoc, the protoc plugins and h2spec at the pinned versions
tools:
	.ci/tools.sh

## bench: load-test the service at its shipped defaults on a real redis-server, with
## Envoy's 20 ms deadline, against an INCRBY+EXPIRE floor: 54 scenarios of 6 s;
## BENCH_QUICK=1: a representative subset (< 1 min); BENCH_FLAGS: more flags (docs/bench.md)
bench:
	$(GO) run ./cmd/ratelimit-bench $(BENCH_FLAGS)

## bench-attacks: e2e TestAttack as a measurement: each HTTP/2 attack for 20 s against
## both gRPC servers, legitimate calls with Envoy's 50 ms deadline (docs/reliability.md)
bench-attacks:
	ATTACK_FOR=20s ATTACK_DEADLINE=50ms $(GO) test -count=1 -timeout 30m -run '^TestAttack$$' -v ./e2e/ | grep -v '^=== '

## bench-micro: the Go micro-benchmarks, with allocations
bench-micro:
	$(GO) test -run '^$$' -bench . -benchmem ./internal/config ./internal/limiter ./internal/service ./internal/grpcunary

FUZZTIME ?= 30s
FUZZFLAGS ?= -fuzztime=$(FUZZTIME) -fuzzminimizetime=5s

## fuzz: run each fuzz target for FUZZTIME (crashers are written to testdata/fuzz/)
fuzz:
	$(GO) test -run='^$$' -fuzz='^FuzzParse$$' $(FUZZFLAGS) ./internal/config
	$(GO) test -run='^$$' -fuzz='^FuzzMatch$$' $(FUZZFLAGS) ./internal/config
	$(GO) test -run='^$$' -fuzz='^FuzzKeyInjective$$' $(FUZZFLAGS) ./internal/limiter
	$(GO) test -run='^$$' -fuzz='^FuzzConn$$' $(FUZZFLAGS) ./internal/grpcunary

## accuracy: each algorithm against an exact sliding window (see docs/accuracy.md)
accuracy:
	$(GO) run ./cmd/ratelimit-sim -trace all
