GO ?= go
GOFLAGS_TEST ?= -race -count=1

.PHONY: run test build vet clean proto tools

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
