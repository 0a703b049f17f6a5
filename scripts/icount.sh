#!/usr/bin/env bash
# Instructions per decision of one benchmark of a compiled test binary
# (BENCHMARKS.md, "Decision cost"): cachegrind counts every instruction the
# binary runs at two iteration counts, and the difference divided by the
# difference of iterations cancels set-up. GOGC=off keeps garbage
# collections (which fall at different iterations from run to run) out of
# the count; the decision path allocates nothing, so memory stays flat.
#
# cpu.rdtscp=off: valgrind (3.19) does not decode RDTSCP, which the Go
# runtime's cputicks executes when a runtime lock is contended (mutex
# profile timing); the program then dies of SIGILL at a random point and
# cachegrind reports the instructions run until then. That, not load on
# the machine, made the figures differ by thousands between runs. Every
# run must also end with the benchmark's line and PASS, or the script
# fails instead of printing a figure.
#   go test -c -o /tmp/x.test ./route/httpapi
#   scripts/icount.sh /tmp/x.test BenchmarkRoutePrefixAffinity [2000 12000]
set -euo pipefail
bin=$1 bench=$2 lo=${3:-2000} hi=${4:-12000}
count() {
	local out err rc=0
	out=$(mktemp) err=$(mktemp)
	GOGC=off GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off valgrind --tool=cachegrind --cache-sim=no \
		--cachegrind-out-file=/dev/null "$bin" -test.run XXX -test.bench "^$bench\$" \
		-test.benchtime "${1}x" -test.cpu 1 >"$out" 2>"$err" || rc=$?
	if [ "$rc" -ne 0 ] || ! grep -q "^$bench[[:space:]]" "$out" || ! grep -q '^PASS$' "$out"; then
		echo "icount: $bench at $1 iterations failed (exit $rc):" >&2
		tail -n 20 "$out" "$err" >&2
		rm -f "$out" "$err"
		return 1
	fi
	sed -n 's/.*I *refs: *//p' "$err" | tr -d ,
	rm -f "$out" "$err"
}
a=$(count "$lo")
b=$(count "$hi")
echo "$bench $(( (b - a) / (hi - lo) ))"
