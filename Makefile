# turnout — see README.md. `make demo` runs the demo, `make test` the tests.
GO      ?= go
BIN     := bin/turnout
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
export CGO_ENABLED := 0

.PHONY: kube-apiserver bench-kube all build test test-unit test-e2e bench bench-smoke demo run fuzz vet clean soak

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

# kube-apiserver for the Kubernetes discovery tests (issue 10), built from the
# Go module proxy once and cached under ~/.cache/turnout (.ci/run calls it).
kube-apiserver:
	@bash scripts/kube-apiserver.sh >/dev/null

# Kubernetes discovery figures of BENCHMARKS.md: slice change -> HAProxy
# runtime state (100 changes), sync time and RSS at 1,000 and 5,000 endpoints.
bench-kube: build kube-apiserver
	TURNOUT_KUBE_BENCH=1 TURNOUT_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -tags e2e -timeout 10m -v \
		-run 'TestKubeChangeLatency|TestKubeScale' ./test/ | grep -E 'RESULT|n=|^(---|ok|FAIL)'

# Quick fuzzing pass over the payload parser and the handler.
fuzz:
	$(GO) test ./route/payload/ -run XXX -fuzz FuzzIndex -fuzztime 30s
	$(GO) test ./route/ -run XXX -fuzz FuzzRouteHandler -fuzztime 30s

# Micro benchmarks of the decision path (see BENCHMARKS.md): through the HTTP
# handler (route/httpapi), route's own (kv-aware) and the feedback path.
DECISION_BENCH_PKGS = ./route/ ./route/httpapi ./route/feedback

bench: build
	$(GO) test $(DECISION_BENCH_PKGS) -run XXX -bench . -benchmem -benchtime 2s | tee bench-route.txt
	@if [ -x scripts/bench.sh ]; then scripts/bench.sh; fi

# The decision benchmarks warm up before timing, so even 100 iterations
# report the steady state: any allocs/op above 0 fails the smoke.
bench-smoke: build
	@out=$$($(GO) test $(DECISION_BENCH_PKGS) -run XXX -bench . -benchtime 100x) || { echo "$$out"; exit 1; }; echo "$$out"; \
	echo "$$out" | awk '/allocs\/op/ && $$(NF-1) != 0 { print "bench smoke: " $$1 " allocates " $$(NF-1) " times per decision"; bad = 1 } END { exit bad }'
	@if [ -x scripts/bench.sh ]; then BENCH_SMOKE=1 scripts/bench.sh; fi

# turnout serve with the embedded default config (and the mock replicas it
# names), in the foreground. Ports: PORT_BASE=... or MOCK_PORT, TURNOUT_PORT,
# FEEDBACK_PORT (scripts/lib.sh). "exec" makes bash make's own child, so a
# TERM from make (or a kill of make) reaches the script that owns the processes.
run: build
	TURNOUT_BIN=$(abspath $(BIN)) exec bash scripts/run.sh

# The demo (K8S=1: following a local API server, scripts/demo-kube.sh): turnout + HAProxy (or nginx: PROXY=nginx) + 4 mock replicas.
# Ports as for run, plus HAPROXY_PORT / NGINX_PORT.
demo: build
ifeq ($(K8S),1)
	TURNOUT_BIN=$(abspath $(BIN)) exec bash scripts/demo-kube.sh
else
	PROXY=$(or $(PROXY),haproxy) TURNOUT_BIN=$(abspath $(BIN)) exec bash scripts/demo.sh
endif

clean:
	rm -rf bin bench-out bench-route.txt

# Issue 16 soak: reloads, churn and kills under load for SOAK (default 10m),
# asserting every decision closes, then the slow-body attack's RSS
# (RELIABILITY.md). Not part of `make test`.
soak: build
	TURNOUT_SOAK=$(or $(SOAK),10m) TURNOUT_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -tags e2e -timeout 60m -parallel 3 -run 'TestSoak|TestSlowBodyAttackRSS' -v ./test/
