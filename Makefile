GO ?= go
GOFLAGS_TEST ?= -race -count=1 -timeout=24m -parallel=6

# The Go tools (.ci/tools.sh installs them into GOBIN) must be found by the
# recipes and by the tests that run them (h2spec, the code generators), even
# when GOBIN is not on the caller's PATH.
GOBIN_DIR := $(or $(shell $(GO) env GOBIN 2>/dev/null),$(addsuffix /bin,$(shell $(GO) env GOPATH 2>/dev/null)))
export PATH := $(if $(GOBIN_DIR),$(GOBIN_DIR):)$(PATH)

# Prerequisites run in the order written (tools before lint before the
# tests); go parallelises within each step.
.NOTPARALLEL:

.PHONY: run test lint build vet api clean proto tools sim bench bench-attacks bench-micro fuzz accuracy

## run: serve the example config on the embedded store (gRPC :8081, HTTP :8080, admin localhost:9090)
run:
	$(GO) run ./cmd/ratelimit --config examples/config --log-format console --admin-addr localhost:9090

## test: install what the tests need when it is missing (make tools: redis-server and
## redis-sentinel, Lua 5.1's C library, protoc, promtool, the code generators, h2spec, golangci-lint, apidiff), then lint
## (govet among its linters, with go vet's analyzers), the API check, and every test with
## the race detector
test: tools lint api
	$(GO) test $(GOFLAGS_TEST) ./...

## lint: golangci-lint at its pinned version (installed when missing), config .golangci.yml
lint:
	.ci/tools.sh lua golangci-lint
	golangci-lint run ./...

build:
	CGO_ENABLED=0 $(GO) build -o bin/ratelimit ./cmd/ratelimit

vet:
	.ci/tools.sh lua
	$(GO) vet ./...

## api: the public packages (pkg/..., scripts/lua) against their committed API baseline
## (api/*.export): an incompatible change fails; .ci/api.sh --write records one on purpose
api:
	.ci/tools.sh apidiff
	.ci/api.sh

clean:
	rm -rf bin

## proto: regenerate the Go code of proto/**/*.proto (the generators are installed when missing)
proto:
	.ci/tools.sh protoc protoc-gen-go protoc-gen-go-grpc
	proto/generate.sh

## tools: install what is missing of what make test needs, at the pinned versions:
## redis-server, redis-sentinel, Lua 5.1's C library, protoc and promtool (apt-get), the protoc plugins, h2spec,
## golangci-lint and apidiff (go install into GOBIN); a check of about a second when all is there
tools:
	.ci/tools.sh

## bench: load-test the service at its shipped defaults on a real redis-server, with
## Envoy's 20 ms deadline, against an INCRBY+EXPIRE floor: 66 scenarios of 6 s, then
## Zipf and uniform keys beside envoyproxy/ratelimit itself (go install), open-loop latency
## at 500-10,000 requests/s beside it (about 5 min), RLQS, bursts, 50 callers on 5 seats over two instances;
## BENCH_QUICK=1: a representative subset (about a minute and a half, and a minute more of latency); BENCH_FLAGS: more flags (docs/bench.md)
bench:
	$(GO) run ./cmd/ratelimit-bench $(BENCH_FLAGS)

SIM_SCHEDULES ?= 100000
SIM_FOR ?= 0
SIM_FROM ?= $(shell date +%s)

## sim: the simulator of the limit's promise (internal/hotkeys/sim_test.go): random schedules of
## hits, refunds, recorded costs, leases, Resets, reloads, lost replies, failovers and restarts through several
## instances' slices on the real Lua, with a per-second store beside the main one: SIM_SCHEDULES
## per algorithm from seed SIM_FROM (default the Unix time: each run searches new schedules; its
## summary names the seeds) (the five side by side), for at most SIM_FOR (0: no cap); a failure
## prints its seed and the schedule shrunk (replay: -sim.seed N). GOGC=400: the search allocates
## much and lives short; a fifth more schedules in its time
sim:
	GOGC=400 $(GO) test -count=1 -timeout 0 -parallel 5 -run '^TestSimulator$$' -v ./internal/hotkeys -sim.schedules $(SIM_SCHEDULES) -sim.for $(SIM_FOR) -sim.from $(SIM_FROM) | grep -v '^=== '

## bench-attacks: e2e TestAttack as a measurement: each HTTP/2 attack for 20 s against
## both gRPC servers, legitimate calls with Envoy's 50 ms deadline (docs/reliability.md)
bench-attacks:
	ATTACK_FOR=20s ATTACK_DEADLINE=50ms $(GO) test -count=1 -timeout 30m -run '^TestAttack$$' -v ./e2e/ | grep -v '^=== '

## bench-micro: the Go micro-benchmarks, with allocations
bench-micro:
	$(GO) test -run '^$$' -bench . -benchmem ./internal/config ./internal/limiter ./internal/service ./internal/grpcunary ./scripts/lua

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
