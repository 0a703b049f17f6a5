#!/usr/bin/env bash
# turnout benchmarks (see BENCHMARKS.md). Called by `make bench` after the
# route micro benchmarks, and by `make bench-smoke` (BENCH_SMOKE=1) inside
# `make test`, where it must stay a few seconds long and fail on breakage.
#
#   scripts/bench.sh                 quick versions of everything (< 5 min), into bench-out/
#   BENCH_SMOKE=1 scripts/bench.sh   smoke: tiny runs with sanity checks, into bench-out/smoke/
#
# Environment: TURNOUT_BIN (default bin/turnout, built if missing; serve and
# render), TURNOUT_LAB_BIN (default bin/turnout-lab, built if missing; the
# bench harness and the mock replicas),
# BENCH_OUT (default bench-out), TRACES (default ../shared/traces),
# NGINX_JS_MODULE (default Debian's njs module path).
set -euo pipefail
cd "$(dirname "$0")/.."

TURNOUT=${TURNOUT_BIN:-bin/turnout}
BIN=${TURNOUT_LAB_BIN:-bin/turnout-lab}
OUT=${BENCH_OUT:-bench-out}
TRACES=${TRACES:-../shared/traces}
MOONCAKE=$TRACES/mooncake_synthetic_trace.jsonl
AZURE=$TRACES/azure_llm_2023_conv.csv
NJS=${NGINX_JS_MODULE:-/usr/lib/nginx/modules/ngx_http_js_module.so}

if [ ! -x "$TURNOUT" ]; then
  echo "bench: building $TURNOUT"
  CGO_ENABLED=0 go build -o "$TURNOUT" ./cmd/turnout
fi
if [ ! -x "$BIN" ]; then
  echo "bench: building $BIN"
  CGO_ENABLED=0 go build -o "$BIN" ./cmd/turnout-lab
fi
# Info logs go to a file; warnings and errors stay on the terminal.
export TURNOUT_LOG_LEVEL=${TURNOUT_LOG_LEVEL:-warn}
have() { command -v "$1" >/dev/null 2>&1; }
# The nginx e2e replays need nginx, and njs for turnout's body mode. The Go
# side skips them too (only a log warning); checking here prints one line.
nginx_missing() {
  if ! have nginx; then
    echo "nginx not installed (apt-get install -y nginx libnginx-mod-http-js)"
  elif [ ! -f "$NJS" ]; then
    echo "njs module $NJS not found (apt-get install -y libnginx-mod-http-js)"
  fi
}

if [ "${BENCH_SMOKE:-}" = 1 ]; then
  OUT=$OUT/smoke
  mkdir -p "$OUT"
  start=$SECONDS
  # Sim on a generated trace: always available, exercises every policy.
  "$BIN" bench replay --trace synthetic --limit 200 --check --out "$OUT" >/dev/null
  if [ -f "$MOONCAKE" ]; then
    "$BIN" bench replay --trace "$MOONCAKE" --limit 300 --check --out "$OUT" >/dev/null
  else
    echo "bench smoke: $MOONCAKE not found, skipping the Mooncake sim (traces live in ../shared/traces)"
  fi
  if have haproxy; then
    # The real path: HAProxy + Lua + turnout + mock replicas, and HAProxy alone.
    "$BIN" bench replay --turnout-bin "$TURNOUT" --mode e2e --trace synthetic --limit 60 --time-scale 0.05 \
      --policies 'haproxy-roundrobin;prefix-affinity' --check --out "$OUT" >/dev/null
  else
    echo "bench smoke: haproxy not installed, skipping the e2e replay"
  fi
  missing=$(nginx_missing)
  if [ -z "$missing" ]; then
    # The same through nginx: nginx alone, and turnout in body mode (njs).
    "$BIN" bench replay --turnout-bin "$TURNOUT" --mode e2e --proxy nginx --trace synthetic --limit 60 --time-scale 0.05 \
      --policies 'nginx-roundrobin;prefix-affinity' --nginx-js-module "$NJS" --check --out "$OUT" >/dev/null
  else
    echo "bench smoke: $missing, skipping the nginx e2e replay"
  fi
  # Cost machinery with the Go load generator (wrk may be absent in CI).
  "$BIN" bench cost --turnout-bin "$TURNOUT" --loadgen go --haproxy '' --nginx '' --duration 500ms --rounds 1 --policies prefix-affinity \
    --check --out "$OUT" >/dev/null
  echo "bench smoke: ok in $((SECONDS - start)) s; outputs in $OUT"
  exit 0
fi

mkdir -p "$OUT"
LOG=$OUT/bench.log
: >"$LOG"
# The default policy rows (HAProxy alone, every registered turnout policy),
# ';'-terminated, to append variants to.
default_policies() {
  "$BIN" bench policies | tr '\n' ';'
}
run() {
  local t0=$SECONDS
  echo "+ $*" | tee -a "$LOG"
  "$@" 2>>"$LOG"
  # Per-step times show where the five-minute budget goes.
  echo "  ($((SECONDS - t0)) s)" | tee -a "$LOG"
}

# Machine facts; none of these may fail the run (wrk -v exits 1, head
# closes pipes early).
{
  echo "# turnout benchmark run $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo
  echo '```'
  echo "turnout: $("$TURNOUT" version 2>/dev/null || echo unknown), tree $(git describe --always --dirty 2>/dev/null || echo unknown)"
  echo "nproc: $(nproc)"
  (lscpu | head -n 15) || true
  go version || true
  if have haproxy; then (haproxy -v | head -n 1) || true; fi
  if have nginx; then
    (nginx -v 2>&1 | head -n 1) || true
    if [ -f "$NJS" ]; then echo "njs: $NJS"; else echo "njs: not installed"; fi
  fi
  if have wrk; then (wrk -v 2>&1 | head -n 1) || true; fi
  echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo '```'
} >"$OUT/machine.md"

if [ -f "$MOONCAKE" ]; then
  # Routing quality. Default replicas hold every reused prefix (8.4M tokens
  # each), so the table shows routing, not capacity; then a GPU-sized cache.
  run "$BIN" bench replay --trace "$MOONCAKE" --sweep quick --out "$OUT"
  run "$BIN" bench replay --trace "$MOONCAKE" --cache-blocks 32768 --name replay-sim-mooncake-gpucache --out "$OUT"
  # No session header at all: prefix matching alone (session-hash degrades
  # to least-request, prefix-affinity loses its session stickiness).
  run "$BIN" bench replay --trace "$MOONCAKE" --session-blocks 0 --name replay-sim-mooncake-nosession --out "$OUT" \
    --policies "$(default_policies)prefix-affinity:capacity_blocks=1048576;prefix-affinity:capacity_blocks=1048576,balance_abs=2"
  # Twice the trace's rate on 8 running sequences per replica: the replicas
  # run near saturation, so imbalance turns into queueing and the load
  # guards matter. The extra rows are the sweep's best settings.
  run "$BIN" bench replay --trace "$MOONCAKE" --compress 2 --max-running 8 --name replay-sim-mooncake-loaded --out "$OUT" \
    --policies "$(default_policies)prefix-affinity:capacity_blocks=1048576;prefix-affinity:capacity_blocks=1048576,session_affinity=false;prefix-affinity:capacity_blocks=1048576,balance_abs=4;prefix-affinity:capacity_blocks=1048576,balance_abs=2,session_affinity=false;prefix-affinity:block_bytes=512,capacity_blocks=262144,balance_abs=2,session_affinity=false"
  if have haproxy; then
    run "$BIN" bench replay --turnout-bin "$TURNOUT" --trace "$MOONCAKE" --mode e2e --limit 400 --time-scale 0.05 --out "$OUT"
  else
    echo "bench: haproxy not installed, skipping the e2e replay" | tee -a "$LOG"
  fi
  missing=$(nginx_missing)
  if [ -z "$missing" ]; then
    # The same requests through nginx (turnout in body mode, njs): do hit
    # ratios and loads agree with the HAProxy path? Two rows, not seven, to
    # stay within the five-minute budget.
    run "$BIN" bench replay --turnout-bin "$TURNOUT" --trace "$MOONCAKE" --mode e2e --proxy nginx --limit 400 --time-scale 0.05 --out "$OUT" \
      --policies 'nginx-roundrobin;prefix-affinity' --nginx-js-module "$NJS"
  else
    echo "bench: $missing, skipping the nginx e2e replay" | tee -a "$LOG"
  fi
else
  echo "bench: $MOONCAKE not found, skipping the Mooncake replays (traces live in ../shared/traces)" | tee -a "$LOG"
fi
if [ -f "$AZURE" ]; then
  # Lengths only: a load-balance and queueing comparison (8 running
  # sequences per replica so imbalance turns into queueing).
  run "$BIN" bench azure --trace "$AZURE" --max-running 8 --out "$OUT"
else
  echo "bench: $AZURE not found, skipping the Azure replay" | tee -a "$LOG"
fi
# Without nginx or njs the nginx rows become notes in the table.
run "$BIN" bench cost --turnout-bin "$TURNOUT" --nginx-js-module "$NJS" --out "$OUT"

# One file with every table, for BENCHMARKS.md.
{
  cat "$OUT/machine.md"
  echo
  echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg) (throughput figures are only comparable on a quiet box)"
  if [ -f bench-route.txt ]; then
    echo
    echo "## Decision micro benchmarks (go test ./route/ ./route/httpapi ./route/feedback -bench)"
    echo '```'
    grep -E '^(Benchmark|ok|PASS)' bench-route.txt || true
    echo '```'
  fi
  for f in replay-sim-mooncake replay-sim-mooncake-nosession replay-sim-mooncake-gpucache replay-sim-mooncake-loaded replay-e2e-mooncake replay-e2e-nginx-mooncake replay-sim-azure-conv cost; do
    if [ -f "$OUT/$f.md" ]; then
      echo
      echo "## $f"
      echo
      cat "$OUT/$f.md"
    fi
  done
} >"$OUT/SUMMARY.md"
echo "bench: tables in $OUT/SUMMARY.md, charts in $OUT/*.svg, log in $LOG"
