#!/usr/bin/env bash
# Instructions per decision of one benchmark of a compiled test binary
# (BENCHMARKS.md, "Decision cost"): callgrind counts the instructions run
# inside the benchmark's per-decision function only (--toggle-collect), at
# two iteration counts, and the difference divided by the difference of
# iterations cancels the warm-up. Counting only that function keeps out
# what runs by wall time (the runtime's sysmon and scavenger, timers),
# which valgrind stretches and the machine's load varies, and the set-up
# (whether a fresh server's memory must be cleared depends on what the
# scavenger returned meanwhile). GOGC=off keeps collections out.
#
# cpu.rdtscp=off: valgrind (3.19) does not decode RDTSCP, which the Go
# runtime's cputicks executes when a runtime lock is contended (mutex
# profile timing); the program then dies of SIGILL at a random point. Every
# run must end with the benchmark's line and PASS, or the script fails
# instead of printing a figure.
#
# COLLECT names the per-decision function (callgrind patterns, * and ?;
# several separated by spaces). The default fits route/httpapi's
# BenchmarkRoute*: benchRoute's decide closure (handler, decision id,
# completion), within 0.3 % over repeated runs. Collecting the RunParallel
# body (entered once per run) or (*API).Handler alone gave counts that
# jumped by ~6 % between runs (callgrind loses track of Go's calls there),
# so BenchmarkRouteParallel* and COLLECT= (empty) count the whole program
# (spread ~0.5 %).
#   go test -c -o /tmp/x.test ./route/httpapi
#   scripts/icount.sh /tmp/x.test BenchmarkRoutePrefixAffinity [2000 12000]
set -euo pipefail -f # -f: COLLECT holds patterns, not paths
bin=$1 bench=$2 lo=${3:-2000} hi=${4:-12000}
if [ -n "${COLLECT+set}" ]; then
	collect=$COLLECT
else
	case $bench in
	BenchmarkRouteParallel*) collect= ;;
	*) collect='*/route/httpapi.benchRoute.func1' ;;
	esac
fi
toggles=(--collect-atstart=yes)
if [ -n "$collect" ]; then
	toggles=(--collect-atstart=no)
	for f in $collect; do toggles+=("--toggle-collect=$f"); done
fi
count() {
	local out err rc=0 n
	out=$(mktemp) err=$(mktemp)
	GOGC=off GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off valgrind --tool=callgrind \
		"${toggles[@]}" --callgrind-out-file=/dev/null "$bin" -test.run XXX -test.bench "^$bench\$" \
		-test.benchtime "${1}x" -test.cpu 1 >"$out" 2>"$err" || rc=$?
	n=$(sed -n 's/.*Collected *: *//p' "$err")
	if [ "$rc" -ne 0 ] || ! grep -q "^$bench[[:space:]]" "$out" || ! grep -q '^PASS$' "$out" || [ "${n:-0}" -eq 0 ]; then
		echo "icount: $bench at $1 iterations failed (exit $rc, ${n:-no} instructions collected; COLLECT=$collect):" >&2
		tail -n 20 "$out" "$err" >&2
		rm -f "$out" "$err"
		return 1
	fi
	echo "$n"
	rm -f "$out" "$err"
}
a=$(count "$lo")
b=$(count "$hi")
echo "$bench $(( (b - a) / (hi - lo) ))"
