#!/usr/bin/env bash
# CNI ADD latency: 50 concurrent ADDs (and a serial baseline in the same
# run) through libcni against a real tendril-agent in a node network
# namespace. Needs root. Results go to stdout; docs/benchmarks/cni.md
# records them with the machine they came from.
#
#   bench/cni/run.sh            # 5 rounds of 50 ADDs (250 samples)
#   ROUNDS=10 bench/cni/run.sh
#   TENDRIL_BENCH_AGENT_ARGS="--enable-datapath=false" bench/cni/run.sh   # extra agent flags
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-5}
echo "# $(date -u +%FT%TZ) $(uname -r) $(nproc) CPUs, load: $(cut -d' ' -f1-3 /proc/loadavg)${TENDRIL_BENCH_AGENT_ARGS:+, agent flags: $TENDRIL_BENCH_AGENT_ARGS}"
go test -count=1 -run '^$' -bench 'PrivilegedSerialAdd|PrivilegedConcurrentAdd50' \
	-benchtime "${ROUNDS}x" -timeout 20m ./test/cni/
