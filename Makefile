# turnout — see README.md. `make demo` runs the demo, `make test` the tests.
GO      ?= go
BIN     := bin/turnout
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
export CGO_ENABLED := 0

.PHONY: all build test test-unit test-e2e bench bench-smoke demo demo-k8s run fuzz vet clean

all: build

build:
	$(GO) build -trimpath -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/turnout

vet:
	$(GO) vet -tags e2e ./...

# Unit tests, then end-to-end tests against real haproxy/nginx, then a bench smoke run.
test: build vet test-unit test-e2e bench-smoke

test-unit:
	$(GO) test -count=1 ./...

test-e2e: build
	@test -d test || { echo "no end-to-end tests yet"; exit 0; }; \
	TURNOUT_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -tags e2e -timeout 10m ./test/...

# Quick fuzzing pass over the payload parser and the handler.
fuzz:
	$(GO) test ./route/ -run XXX -fuzz FuzzPayload -fuzztime 30s
	$(GO) test ./route/ -run XXX -fuzz FuzzRouteHandler -fuzztime 30s

# Micro benchmarks of the decision path (see BENCHMARKS.md).
bench: build
	$(GO) test ./route/ -run XXX -bench . -benchmem -benchtime 2s | tee bench-route.txt
	@if [ -x scripts/bench.sh ]; then scripts/bench.sh; fi

bench-smoke: build
	$(GO) test ./route/ -run XXX -bench . -benchtime 100x
	@if [ -x scripts/bench.sh ]; then BENCH_SMOKE=1 scripts/bench.sh; fi

# turnout serve with the embedded default config (and the mock replicas it names).
run: build
	TURNOUT_BIN=$(BIN) bash scripts/run.sh

# The demo: turnout + HAProxy (or nginx: PROXY=nginx) + 4 mock replicas.
demo: build
	PROXY=$(or $(PROXY),haproxy) TURNOUT_BIN=$(CURDIR)/$(BIN) bash scripts/demo.sh

# The Kubernetes discovery demo (also: make demo K8S=1): etcd + kube-apiserver,
# turnout, HAProxy and mock replicas in a network namespace (needs root);
# scales decode 2 -> 4 -> 2 through EndpointSlices (scripts/demo-k8s.sh).
demo-k8s: build
	TURNOUT_BIN=$(CURDIR)/$(BIN) bash scripts/demo-k8s.sh

clean:
	rm -rf bin bench-out bench-route.txt
