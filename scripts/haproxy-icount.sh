#!/usr/bin/env bash
# HAProxy's instructions per request for the cost bench's configs
# (BENCHMARKS.md, "On the proxy path"): a figure the box's load does not
# move, unlike req/s. turnout-lab bench cost --keep renders the configs
# exactly as the bench runs them (plain HAProxy, the default SPOE render,
# l7_retries: false, first_token_timing: false, the Lua path); this script
# starts the same mocks and turnout again, runs HAProxy under callgrind
# with nbthread 1, sends WARM requests one at a time over one keep-alive
# connection (2 KiB and 8 KiB chat bodies, as the bench), zeroes the
# counters, sends N more and divides the instructions counted by N.
#
# What runs by wall time lands in the count too (health checks every 2 s,
# the agent's spop-check every 1 s; a few thousand instructions per
# request at N=400): compare configs from the same run, and repeat.
#
#   make build && scripts/haproxy-icount.sh [DIR ...]
#   N=400 WARM=50 ROUNDS=3 scripts/haproxy-icount.sh with-turnout-spoe plain
# DIR: a setup of bench cost's work directory (default: plain, with-turnout-spoe,
# with-turnout-spoe-l7retry, with-turnout-spoe-notft). Prints one line per
# setup and round: "DIR round R: I instructions per request".
# BENCH_ARGS=more bench cost flags for the rendered setups (e.g. "--route-body
# 16384" adds with-turnout-spoe-rb16384 and plain-buf32768);
# BIN=dir of turnout and turnout-lab (default bin/); HAPROXY=haproxy binary;
# KEEP=dir keeps each counted dump there as SETUP.rROUND.callgrind, for
# callgrind_annotate (where the instructions go).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-$PWD/bin} HAPROXY=${HAPROXY:-haproxy}
N=${N:-400} WARM=${WARM:-50} ROUNDS=${ROUNDS:-1}
setups=("$@")
[ ${#setups[@]} -gt 0 ] || setups=(plain with-turnout-spoe with-turnout-spoe-l7retry with-turnout-spoe-notft)
for t in valgrind callgrind_control curl "$HAPROXY" "$BIN/turnout" "$BIN/turnout-lab"; do
	command -v "$t" >/dev/null || { echo "haproxy-icount: $t not found" >&2; exit 1; }
done

out=$(mktemp -d /tmp/haproxy-icount.XXXXXX)
pids=() mockpids=()
stop() { # the setup's turnout and HAProxy
	local p
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	pids=()
}
trap 'stop; pids=("${mockpids[@]}"); stop; rm -rf "$out"' EXIT

# The configs, rendered by the bench itself (one short round, kept).
"$BIN/turnout-lab" bench cost --keep --nginx '' --large-body 0 --latency-duration 0 --idle-conns 0 --haproxy-nbthread 0 \
	--sse-probes 1 --rounds 1 --duration 500ms --policies '' --out "$out/bench" ${BENCH_ARGS:-} >"$out/bench.log" 2>&1 ||
	{ tail -n 20 "$out/bench.log" >&2; exit 1; }
work=$(sed -n 's/.*"dir":"\([^"]*\)".*work directory kept.*/\1/p' "$out/bench.log" | head -n 1)
[ -d "$work" ] || { echo "haproxy-icount: no work directory in $out/bench.log" >&2; exit 1; }
trap 'stop; pids=("${mockpids[@]}"); stop; rm -rf "$out" "$work"' EXIT

# The bench's mocks again, on the addresses the configs name.
mocks=$(sed -n 's/.*{name: \(r[0-9]*\), address: "\([^"]*\)"}.*/\1=\2/p' "$work/with-turnout-spoe/turnout.yaml")
for m in $mocks; do
	"$BIN/turnout-lab" mock --listen "${m#*=}" --name "${m%%=*}" --model llama --ttft-overhead 0s --per-token-prefill 0s \
		--itl 1ms --time-scale 1 --max-running 0 --cache-blocks 4096 --request-log-size -1 >"$out/mock-${m%%=*}.log" 2>&1 &
	mockpids+=($!)
done

# Chat bodies of 2 KiB and 8 KiB (the bench's small bodies), one curl
# config that sends them alternately over one connection.
body() { # SIZE
	local fill
	fill=$(head -c "$1" /dev/zero | tr '\0' 'a' | sed 's/a\{9\}/lorem ip /g')
	printf '{"model":"llama","messages":[{"role":"user","content":"%s"}],"max_tokens":1}' "${fill:0:$(($1 - 80))}"
}
body 2048 >"$out/b0.json"
body 8192 >"$out/b1.json"
curlcfg() { # URL COUNT FILE
	local i
	: >"$3"
	for ((i = 0; i < $2; i++)); do
		[ "$i" -gt 0 ] && echo next >>"$3"
		printf 'url = "%s"\ndata-binary = "@%s/b%d.json"\nheader = "Content-Type: application/json"\noutput = "/dev/null"\nwrite-out = "%%{http_code}\\n"\n' \
			"$1" "$out" $((i % 2)) >>"$3"
	done
}

wait_for() { # what, then a command that succeeds when ready
	local what=$1 i
	shift
	for ((i = 0; i < 600; i++)); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	echo "haproxy-icount: $what did not come up" >&2
	return 1
}

count() { # SETUP ROUND
	local dir=$work/$1 cfg front tpid="" hpid url codes ir
	cfg=$dir/haproxy/icount.cfg
	# One thread, no master: callgrind follows the one process that works.
	sed -e '/^\s*master-worker\s*$/d' -e 's/^global$/global\n    nbthread 1/' "$dir/haproxy/haproxy.cfg" >"$cfg"
	front=$(awk '/^frontend /{f=1} f && $1=="bind"{print $2; exit}' "$cfg")
	url=http://$front/v1/chat/completions
	if [ -f "$dir/turnout.yaml" ]; then
		rm -f "$dir/haproxy/spoe.sock"
		"$BIN/turnout" serve --config "$dir/turnout.yaml" --watch 0 --log-level warn >"$out/turnout.log" 2>&1 &
		tpid=$!
		pids+=("$tpid")
		wait_for "turnout ($1)" test -S "$dir/haproxy/spoe.sock"
	fi
	valgrind --tool=callgrind --callgrind-out-file="$out/cg.%p" "$HAPROXY" -db -f "$cfg" >"$out/haproxy.log" 2>&1 &
	hpid=$!
	pids+=("$hpid")
	wait_for "haproxy ($1)" curl -sf "http://$front/v1/models"
	curlcfg "$url" "$WARM" "$out/warm.curl"
	curlcfg "$url" "$N" "$out/count.curl"
	curl -s -K "$out/warm.curl" >/dev/null
	callgrind_control -z "$hpid" >/dev/null 2>&1
	codes=$(curl -s -K "$out/count.curl" | sort | uniq -c | tr -s ' \n' ' ')
	rm -f "$out"/cg.*
	callgrind_control -d "$hpid" >/dev/null 2>&1
	ir=$(awk '/^(summary|totals):/{print $2; exit}' "$out"/cg."$hpid".* 2>/dev/null | head -n 1)
	if [ -n "${KEEP:-}" ]; then
		mkdir -p "$KEEP"
		cp "$out"/cg."$hpid".* "$KEEP/$1.r$2.callgrind"
	fi
	stop
	case $codes in
	" $N 200 ") ;;
	*) echo "haproxy-icount: $1: answers were not all 200:$codes" >&2; return 1 ;;
	esac
	[ -n "$ir" ] || { echo "haproxy-icount: $1: no callgrind dump" >&2; return 1; }
	echo "$1 round $2: $((ir / N)) instructions per request"
}

for ((r = 1; r <= ROUNDS; r++)); do
	for s in "${setups[@]}"; do
		[ -f "$work/$s/haproxy/haproxy.cfg" ] || { echo "haproxy-icount: no setup $s in $work" >&2; exit 1; }
		count "$s" "$r"
	done
done
