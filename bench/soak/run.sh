#!/usr/bin/env bash
# Soak: pod churn on a 2-node lab (10 pods a second created and deleted,
# each connecting to a server pod on the other node under a policy), then
# a count of everything the churn leaked and the agents' memory slope
# (package pkg/lab/soak). Brings its own lab up (name $LAB, default
# soak) and down again; prints Markdown; exits non-zero on any leak.
# Needs root. docs/benchmarks.md records the results.
#
#   bench/soak/run.sh                  # one hour
#   bench/soak/run.sh -duration 10m
#   KEEP=1 bench/soak/run.sh -duration 2m   # leave the lab up after
#   bench/soak/run.sh -heap-profiles /tmp/soak-heaps   # keep each reading's profile
#
# Every agent serves pprof in its node's namespace: the soak reads each
# one's live heap after a forced GC every -heap-every (5m), so a rising
# RSS can be told apart from a leak.
set -euo pipefail
cd "$(dirname "$0")/../.."
LAB=${LAB:-soak}
make -s build k8s-binaries >/dev/null
go build -o bin/soak ./bench/soak
T=bin/tendril
if [ -z "${KEEP:-}" ]; then
	trap '$T lab --name $LAB down >/dev/null 2>&1 || true' EXIT
fi
echo "# $(date -u +%FT%TZ) $(uname -r) $(nproc) CPUs, load: $(cut -d' ' -f1-3 /proc/loadavg), $(git rev-parse --short HEAD)"
# Always a fresh lab of the soak's own name: a lab left by something
# else (other GC timing, other pods) would count its grace periods as
# leaks.
$T lab --name "$LAB" down >/dev/null 2>&1 || true
# The identity and endpoint GCs on short timing (Cilium's defaults
# keep an unused identity 15-45 minutes): at the end, an identity left
# is one the GC missed, not one within its grace period.
$T lab --name "$LAB" up --nodes 2 --pods-per-node 0 \
	--operator-arg=--identity-gc-interval=10s --operator-arg=--identity-heartbeat-timeout=20s \
	--operator-arg=--endpoint-gc-interval=10s \
	--agent-arg=--pprof-serve-addr=127.0.0.1:6060 >/tmp/tendril-soak-up.log 2>&1 ||
	{ cat /tmp/tendril-soak-up.log; exit 1; }
bin/soak -lab "$LAB" "$@"
