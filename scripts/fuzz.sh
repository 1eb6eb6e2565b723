#!/bin/sh
# Runs every fuzz target listed in scripts/fuzz-targets for FUZZTIME each
# (go test fuzzes one target per invocation), then prints each target's
# executions and executions per second. FUZZ_ONLY, a comma-separated list
# of groups or target names, narrows the run. Stops at the first failure,
# whose input go test has written under the package's testdata/fuzz.
set -eu
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-10s}
FUZZ_ONLY=${FUZZ_ONLY:-}
cd "$(dirname "$0")/.."
log=$(mktemp)
summary=$(mktemp)
trap 'rm -f "$log" "$summary"' EXIT
grep -v '^#' scripts/fuzz-targets | while read -r pkg target group; do
	[ -n "$pkg" ] || continue
	if [ -n "$FUZZ_ONLY" ] && ! printf ',%s,' "$FUZZ_ONLY" | grep -q -e ",$group," -e ",$target,"; then
		continue
	fi
	echo "== $pkg $target ($FUZZTIME)"
	if ! $GO test "$pkg" -run '^$' -fuzz "^$target\$" -fuzztime "$FUZZTIME" >"$log" 2>&1; then
		cat "$log"
		exit 1
	fi
	# The last progress line: "fuzz: elapsed: 10s, execs: 123456 (12345/sec), ...".
	last=$(grep '^fuzz: elapsed:' "$log" | grep 'execs:' | tail -n 1)
	elapsed=$(echo "$last" | sed -n 's/^fuzz: elapsed: \([^,]*\),.*/\1/p')
	execs=$(echo "$last" | sed -n 's/.*execs: \([0-9]*\) .*/\1/p')
	secs=$(echo "$elapsed" | awk '{ t = 0; s = $0; if (s ~ /m/) { split(s, a, "m"); t = a[1] * 60; s = a[2] } sub(/s$/, "", s); print t + s }')
	rate=$(awk -v n="${execs:-0}" -v s="$secs" 'BEGIN { if (s > 0) printf "%d", n / s; else print 0 }')
	interesting=$(echo "$last" | sed -n 's/.*new interesting: \([0-9]*\).*/\1/p')
	printf '%-36s %8s %12s %10s/s %6s new\n' "$target" "$elapsed" "$execs" "$rate" "${interesting:-0}" | tee -a "$summary"
done
echo
echo "target                               elapsed        execs      execs/s   corpus"
cat "$summary"
uptime
