#!/usr/bin/env bash
# CNI ADD latency through libcni, 50 concurrent ADDs and a serial baseline,
# in one run: the reference plugins (ptp + host-local from
# containernetworking/plugins, built by hack/cni-plugins.sh from the Go
# module proxy), then tendril-cni against a real tendril-agent with its
# default configuration, in tc mode and in TCX mode without deferral, and
# (50 concurrent only) the default with the burst arriving while the agent
# moves 50 earlier pods to TCX links. Needs root. Prints the benchmark lines,
# then each Tendril variant's p50 and p99 as a ratio of the reference's in
# the same repetition (target for the default: at most 0.6 on both).
#
#   bench/cni/run.sh            # 5 rounds of 50 ADDs (250 samples) per variant, twice
#   ROUNDS=10 REPEAT=3 bench/cni/run.sh
#   TENDRIL_BENCH_AGENT_ARGS="--enable-datapath=false" bench/cni/run.sh   # extra agent flags
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-5}
REPEAT=${REPEAT:-2}
hack/cni-plugins.sh >/dev/null
echo "# $(date -u +%FT%TZ) $(uname -r) $(nproc) CPUs, load: $(cut -d' ' -f1-3 /proc/loadavg)${TENDRIL_BENCH_AGENT_ARGS:+, agent flags: $TENDRIL_BENCH_AGENT_ARGS}"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# The whole set once per repetition, so that each repetition's reference
# and Tendril variants ran minutes apart at most.
for r in $(seq "$REPEAT"); do
	echo "# repetition $r"
	go test -count=1 -run '^$' -bench 'PrivilegedSerialAdd|PrivilegedConcurrentAdd50' \
		-benchtime "${ROUNDS}x" -timeout 60m ./test/cni/ | grep -E '^(Benchmark|ok|FAIL|PASS)'
done | tee "$out"
echo
echo "# ratios to the reference plugins, same repetition (p50, p99)"
awk '
/^# repetition/ { r = $3 }
/^Benchmark.*\/reference/ { split($1, a, "/"); bench = a[1]; rep[bench] = r }
/^Benchmark/ {
	split($1, a, "/"); bench = a[1]; sub(/-[0-9]+$/, "", a[2]); v = a[2]
	for (i = 2; i < NF; i++) { if ($(i+1) == "p50-ms") p50 = $i; if ($(i+1) == "p99-ms") p99 = $i }
	key = bench SUBSEP rep[bench]
	if (v == "reference") { r50[key] = p50; r99[key] = p99; next }
	if (r50[key] > 0) printf "%-40s %-34s p50 %.2f  p99 %.2f\n", bench " #" rep[bench], v, p50 / r50[key], p99 / r99[key]
}' "$out"
