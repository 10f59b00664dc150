#!/usr/bin/env bash
# The agent core (issue 13), old against new in one run: the tree at the
# commit before #13 started (OLD_REV, default e3050e0, checked out with
# `git worktree add` at OLD_DIR, outside the repository) and this tree.
# Every measurement alternates old and new, REPEAT times, so that both saw
# the same machine; the summary prints new/old ratios (below 1: new is
# faster). Needs root (BPF maps, network namespaces, CNI).
#
#   bench/core/run.sh                 # everything, REPEAT=2
#   REPEAT=3 ONLY=start,ipcache bench/core/run.sh
#   RESULTS=/tmp/core.txt ...          # keep the raw samples
#
# Measured: agent start (exec to /v1/healthz answering, standalone, in a
# fresh network namespace; with the BPF datapath loaded and without); restore and regenerate
# 200 endpoints; initial policy resolution; new identity p99; ipcache 100k
# (old: the in-memory ipcache; new: one claim per call, as the event
# sources make them, through the queue, and one transaction per claim);
# CNI ADD 50 concurrent (this tree's harness and plugin, the agent binary
# of each tree); and, new only, regenerating after one policy change at
# 250, 500 and 1,000 local endpoints.
set -euo pipefail
cd "$(dirname "$0")/../.."
NEW_DIR=$PWD
OLD_REV=${OLD_REV:-e3050e0}
OLD_DIR=${OLD_DIR:-/tmp/tendril-core-old}
REPEAT=${REPEAT:-2}
ONLY=${ONLY:-start,restore,policy,ipcache,cni,converge}
command -v bc >/dev/null || { echo "needs bc" >&2; exit 1; }
want() { [[ ",$ONLY," == *",$1,"* ]]; }

if [ ! -d "$OLD_DIR" ]; then
	git worktree add --detach "$OLD_DIR" "$OLD_REV" >/dev/null
fi
[ "$(git -C "$OLD_DIR" rev-parse --short=7 HEAD)" = "$(git rev-parse --short=7 "$OLD_REV")" ] ||
	{ echo "$OLD_DIR is not at $OLD_REV" >&2; exit 1; }
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for t in old new; do
	dir=$OLD_DIR; [ $t = new ] && dir=$NEW_DIR
	(cd "$dir" && go build -o "$work/$t/" ./cmd/tendril-agent)
done
go build -o "$work/startwait" ./bench/core/startwait
go build -o "$work/ratio" ./bench/core/ratio
echo "# $(date -u +%FT%TZ) $(uname -r) $(nproc) CPUs, load: $(cut -d' ' -f1-3 /proc/loadavg); old $OLD_REV, new $(git rev-parse --short HEAD)"

out=$work/results
: >"$out"
# record TREE NAME VALUE UNIT
record() { echo "$1 $2 $3 $4" | tee -a "$out"; }

# gobench TREE DIR PKG BENCH BENCHTIME [ENV...]: each Benchmark line's
# ns/op, B/op, allocs/op and custom metrics, recorded as NAME/metric, and
# the test process's CPU time (user+sys, its waited children included) as
# PKG:BENCH/cpu-s. On a loaded machine wall-clock ns/op swings by 2-4x
# between runs; allocations and CPU time do not.
gobench() {
	local tree=$1 dir=$2 pkg=$3 bench=$4 benchtime=$5
	shift 5
	local bin
	bin="$work/$tree-$(echo "$pkg" | tr -c 'a-zA-Z0-9\n' _).test"
	[ -x "$bin" ] || (cd "$dir" && go test -c -o "$bin" "$pkg")
	(cd "$dir/$pkg" && env "$@" /usr/bin/time -f "%U %S" -o "$work/time" "$bin" -test.run '^$' -test.bench "$bench" \
		-test.benchtime "$benchtime" -test.benchmem -test.timeout 30m) |
		awk -v tree="$tree" '/^Benchmark/ {
			name = $1; sub(/-[0-9]+$/, "", name)
			for (i = 3; i < NF; i += 2) printf "%s %s/%s %s %s\n", tree, name, $(i+1), $i, $(i+1)
		}' | tee -a "$out"
	local u s
	read -r u s <"$work/time"
	record "$tree" "$pkg:$bench/cpu-s" "$(echo "$u + $s" | bc)" s
}

# agent_start TREE NAME [FLAGS...]: ms from exec to /v1/healthz answering,
# timed by startwait (bench/core/startwait: it execs the agent and polls
# its socket every 200 µs in-process; a shell loop of curl processes,
# each ≈ 5 ms to start, quantized the result).
agent_start() {
	local tree=$1 name=$2 ns="tdrcore-start-$1" dir ms
	shift 2
	dir=$(mktemp -d -p "$work")
	ip netns add "$ns"
	nsenter --net=/run/netns/"$ns" ip link set lo up
	read -r ms cpu < <(nsenter --net=/run/netns/"$ns" "$work/startwait" -cpu -socket "$dir/agent.sock" -- \
		"$work/$tree/tendril-agent" --state-dir "$dir/state" --socket "$dir/agent.sock" \
		--bpf-root "/sys/fs/bpf/tdrcore-start-$tree" --install-host-networking=false --prometheus-serve-addr= \
		--node-name bench-node "$@" 2>"$dir/log" || echo failed)
	[ "$ms" != failed ] && [ -n "$cpu" ] || { cat "$dir/log" >&2; exit 1; }
	ip netns del "$ns"
	rm -rf "/sys/fs/bpf/tdrcore-start-$tree"
	record "$tree" "$name/ms" "$ms" ms
	record "$tree" "$name/cpu-ms" "$cpu" ms
}

# pair_order R I: old new, or new old, alternating.
pair_order() { if ((($1 + $2) % 2)); then echo new old; else echo old new; fi; }

for r in $(seq "$REPEAT"); do
	echo "# repetition $r"
	for tree in old new; do
		dir=$OLD_DIR
		[ $tree = new ] && dir=$NEW_DIR
		# 200 restores: 20 (as before) left the first, cold ones in the median.
		want restore && gobench $tree "$dir" ./pkg/endpointmanager 'Restore200$' 200x
		want restore && gobench $tree "$dir" ./pkg/endpointmanager 'RestoreAndRegenerate200' 20x
		want policy && gobench $tree "$dir" ./pkg/policy 'InitialResolution' 3x
		want policy && gobench $tree "$dir" ./pkg/policy 'NewIdentity$' 1000x
		want ipcache && gobench $tree "$dir" ./pkg/ipcache 'IPCache100k' 3x
		# This tree's harness and plugin, each tree's agent.
		want cni && gobench $tree "$NEW_DIR" ./test/cni 'PrivilegedConcurrentAdd50/tendril-default$' 3x \
			TENDRIL_TEST_AGENT="$work/$tree/tendril-agent"
	done
	# The starts in pairs, old and new back to back (which goes first
	# alternates), so that each pair saw the same load: on this machine
	# the load drifts within a run by more than the trees differ, and
	# bench/core/ratio compares the pairs. The kernel frees a stopped
	# agent's maps and programs in the background, which would slow
	# whatever ran next: a pause after each start with the datapath.
	if want start; then
		for i in 1 2 3; do
			for tree in $(pair_order "$r" "$i"); do agent_start $tree agent-start; sleep 2; done
		done
		# The core alone: most of the start above is the kernel's
		# verifier on the pod programs.
		for i in 1 2 3; do
			for tree in $(pair_order "$r" "$i"); do agent_start $tree agent-start-no-datapath --enable-datapath=false; done
		done
	fi
	want converge && gobench new "$NEW_DIR" ./pkg/agent 'PolicyChangeConvergence' 20x
done

echo
echo "# medians, old and new, and new/old"
awk '
{ key = $2; v[$1, key, ++n[$1, key]] = $3; keys[key] = 1 }
function median(t, k,   m, i, j, a, tmp) {
	m = n[t, k]; if (m == 0) return ""
	for (i = 1; i <= m; i++) a[i] = v[t, k, i]
	for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { tmp = a[i]; a[i] = a[j]; a[j] = tmp }
	return (m % 2) ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
}
END {
	for (k in keys) {
		o = median("old", k); w = median("new", k)
		if (o != "" && w != "" && o > 0) printf "%-70s old %12.3f  new %12.3f  new/old %.2f\n", k, o, w, w / o
		else if (w != "") printf "%-70s new %12.3f\n", k, w
	}
	# The ipcache as the event sources use it: old in-memory ipcache
	# against the new queue.
	o = median("old", "BenchmarkPrivilegedIPCache100k/ipcache/ns/op"); w = median("new", "BenchmarkPrivilegedIPCache100k/ipcache-queued/ns/op")
	if (o > 0 && w != "") printf "%-70s old %12.3f  new %12.3f  new/old %.2f\n", "ipcache 100k: old ipcache vs new queued (ns/op)", o, w, w / o
}' "$out" | sort

# The starts' pairs with the noise of the run beside them: the median
# new/old of the pairs with its bootstrap interval, and the same for
# consecutive old samples, an A/A comparison (bench/core/ratio).
echo
echo "# new/old with 95% bootstrap intervals (measurements with 6 samples or more per tree)"
"$work/ratio" "$out"
[ -z "${RESULTS:-}" ] || cp "$out" "$RESULTS"
