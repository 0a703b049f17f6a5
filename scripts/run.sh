#!/usr/bin/env bash
# make run: turnout serve on the embedded default config, with the four mock
# replicas it points at so its health checks pass and the README's curl
# examples get real decisions. Runs in the foreground; Ctrl-C, SIGTERM (or
# make being killed) stops everything it started. Ports: see scripts/lib.sh
# (make run PORT_BASE=18000, TURNOUT_PORT=..., MOCK_PORT=...).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${TURNOUT_BIN:-$ROOT/bin/turnout}
LAB=${TURNOUT_LAB_BIN:-$ROOT/bin/turnout-lab} # the mock replicas
SCRIPT="make run"
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/turnout-run.XXXXXX")
trap 'stop_children; rm -rf "$WORK"' EXIT
trap_signals

check_ports "tcp:$TURNOUT_PORT:turnout" "udp:$FEEDBACK_PORT:completion feedback" \
  "tcp:${MOCK_PORTS[0]}:mock llama-0" "tcp:${MOCK_PORTS[1]}:mock llama-1" \
  "tcp:${MOCK_PORTS[2]}:mock llama-2" "tcp:${MOCK_PORTS[3]}:mock llama-3" || exit 1
write_config "$WORK/turnout.yaml"
# make run starts no HAProxy: its config has HAProxy ask turnout over HTTP
# (haproxy.path lua), so serve expects no SPOE agent and does not warn.
sed -i 's/^haproxy:$/haproxy:\n  path: lua/' "$WORK/turnout.yaml"

for i in 0 1 2 3; do
  start_child "mock llama-$i" "$WORK/mock-$i.log" \
    "$LAB" mock --listen "127.0.0.1:${MOCK_PORTS[$i]}" --name "llama-$i" \
    --model meta-llama/Llama-3.1-8B-Instruct,llama --strict-models --time-scale 0.05
done
for i in 0 1 2 3; do wait_http "mock llama-$i" "http://127.0.0.1:${MOCK_PORTS[$i]}/health" || exit 1; done
echo "make run: mock replicas llama-0..3 on 127.0.0.1:${MOCK_PORTS[0]}-${MOCK_PORTS[3]} (logs in $WORK); turnout on $TURNOUT (Ctrl-C stops all)" >&2
# turnout's own log stays on the terminal.
start_child "turnout serve" - "$BIN" serve --config "$WORK/turnout.yaml" "$@"
supervise
