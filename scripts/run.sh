#!/usr/bin/env bash
# make run: turnout serve on the embedded default config, with the four mock
# replicas it points at (127.0.0.1:8001-8004) so its health checks pass and
# the README's curl examples get real decisions. Ctrl-C stops everything.
set -euo pipefail
BIN=${TURNOUT_BIN:-bin/turnout}
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
for i in 0 1 2 3; do
  "$BIN" mock --listen "127.0.0.1:800$((i + 1))" --name "llama-$i" --time-scale 0.05 >/dev/null 2>&1 &
  pids+=($!)
done
echo "mock replicas llama-0..3 on 127.0.0.1:8001-8004; turnout on 127.0.0.1:9090" >&2
"$BIN" serve "$@" &
pids+=($!)
wait "${pids[-1]}"
