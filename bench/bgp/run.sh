#!/usr/bin/env bash
# The BGP control plane against the lab's real router (BIRD): brings up a
# lab with --bgp (agents with pprof on 127.0.0.1:6060 of their namespace),
# runs bench/bgp (the time from a LoadBalancer address assigned to its
# route in BIRD's table, and in the agents' own loc-rib, over Services
# created one at a time; each agent's memory with 1,000 Services not
# announced and announced) and takes the lab down again, also on failure.
# Needs root and BIRD (apt-get install bird2). Flags go to bench/bgp
# (-services, -total, -gap, -bird-poll, -agent-poll).
#
#   bench/bgp/run.sh
#   NODES=3 bench/bgp/run.sh -services 200
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-bin}
LAB=${LAB:-bgpbnum}
NODES=${NODES:-2}
[ -n "${SKIP_BUILD:-}" ] || make -s build k8s-binaries >/dev/null
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
go build -o "$BIN/bgp-bench" ./bench/bgp
T=$BIN/tendril
LOG=$(mktemp /tmp/tendril-bgpbench.XXXXXX)
trap '$T lab --name $LAB down >/dev/null 2>&1 || true; rm -f "$LOG"' EXIT
$T lab --name "$LAB" up --nodes "$NODES" --pods-per-node 0 --bgp --bin-dir "$BIN" \
	--agent-arg=--pprof-serve-addr=127.0.0.1:6060 >"$LOG" 2>&1 ||
	{ cat "$LOG"; exit 1; }
"$BIN/bgp-bench" -lab "$LAB" "$@"
