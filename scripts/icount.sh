#!/usr/bin/env bash
# Instructions per decision of one benchmark of a compiled test binary
# (BENCHMARKS.md, "Decision cost"): cachegrind counts every instruction the
# binary runs at two iteration counts, and the difference divided by the
# difference of iterations cancels set-up. GOGC=off keeps garbage
# collections (which fall at different iterations from run to run) out of
# the count; the decision path allocates nothing, so memory stays flat.
#   go test -c -o /tmp/x.test ./route/httpapi
#   scripts/icount.sh /tmp/x.test BenchmarkRoutePrefixAffinity [2000 12000]
set -euo pipefail
bin=$1 bench=$2 lo=${3:-2000} hi=${4:-12000}
count() {
	local out
	out=$(mktemp)
	GOGC=off GODEBUG=asyncpreemptoff=1 valgrind --tool=cachegrind --cache-sim=no \
		--cachegrind-out-file=/dev/null "$bin" -test.run XXX -test.bench "^$bench\$" \
		-test.benchtime "${1}x" -test.cpu 1 >/dev/null 2>"$out"
	sed -n 's/.*I *refs: *//p' "$out" | tr -d ,
	rm -f "$out"
}
a=$(count "$lo")
b=$(count "$hi")
echo "$bench $(( (b - a) / (hi - lo) ))"
