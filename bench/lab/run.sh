#!/usr/bin/env bash
# `tendril lab up` wall time, warm (Kubernetes binaries cached, Tendril
# binaries built): 2 nodes, 6 pods, until every agent serves and every pod
# runs Ready with an address. Several rounds, each followed by `lab down`
# (timed too). Needs root. Uses its own lab name, so a lab you run is left
# alone. docs/benchmarks.md records the results.
#
#   bench/lab/run.sh            # 3 rounds
#   ROUNDS=5 bench/lab/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-3}
NAME=labbench
make -s build k8s-binaries >/dev/null
T=bin/tendril
trap '$T lab --name $NAME down >/dev/null 2>&1 || true' EXIT
echo "# $(date -u +%FT%TZ) $(uname -r) $(nproc) CPUs, load: $(cut -d' ' -f1-3 /proc/loadavg)"
ups=()
for round in $(seq "$ROUNDS"); do
	start=$(date +%s.%N)
	$T lab --name $NAME up --nodes 2 --pods-per-node 3 >/tmp/tendril-lab-bench.log 2>&1 ||
		{ cat /tmp/tendril-lab-bench.log; exit 1; }
	up=$(echo "$(date +%s.%N) - $start" | bc)
	steps=$(grep '^==>' /tmp/tendril-lab-bench.log | sed 's/  */ /g' | tr '\n' ';')
	start=$(date +%s.%N)
	$T lab --name $NAME down >/dev/null
	down=$(echo "$(date +%s.%N) - $start" | bc)
	printf 'round %d: lab up %.2f s, lab down %.2f s | %s\n' "$round" "$up" "$down" "$steps"
	ups+=("$up")
done
printf '%s\n' "${ups[@]}" | sort -n | awk '{a[NR]=$1} END {printf "lab up, 2 nodes, 6 pods, warm: median %.2f s, min %.2f s, max %.2f s over %d rounds\n", a[int((NR+1)/2)], a[1], a[NR], NR}'
