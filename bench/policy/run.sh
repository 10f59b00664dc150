#!/usr/bin/env bash
# Policy resolution, old against new in one run: the policy benchmarks of
# pkg/policy and pkg/policy/k8s at a baseline commit (default: the head
# before exact ipBlock semantics and audit mode, 5a2abb2) and at HEAD,
# interleaved round by round so both see the same machine; prints each
# benchmark's median and the new/old ratio.
#
#   bench/policy/run.sh [BASE_COMMIT] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
base=${1:-5a2abb2}
rounds=${2:-5}
old=$(mktemp -d /tmp/tendril-policy-base.XXXXXX)
trap 'git worktree remove --force "$old" >/dev/null 2>&1 || rm -rf "$old"' EXIT
git worktree add -q --detach "$old" "$base"
benches='BenchmarkInitialResolution|BenchmarkNewIdentity|BenchmarkApplyAndResolve200|BenchmarkUpdateOne200'
out=$(mktemp)
for r in $(seq "$rounds"); do
	for side in old new; do
		dir=.
		[ "$side" = old ] && dir=$old
		(cd "$dir" && go test -run '^$' -bench "$benches" -benchtime 5x ./pkg/policy/ ./pkg/policy/k8s/) |
			awk -v side="$side" '/^Benchmark/ {sub(/-[0-9]+$/, "", $1); print side, $1, $3}' >>"$out"
	done
done
echo "policy resolution, $rounds rounds, base $base vs $(git rev-parse --short HEAD) (ns/op, medians)"
printf '%-32s %14s %14s %8s\n' benchmark old new new/old
median() { sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
for b in $(awk '{print $2}' "$out" | sort -u); do
	o=$(awk -v b="$b" '$1 == "old" && $2 == b {print $3}' "$out" | median)
	n=$(awk -v b="$b" '$1 == "new" && $2 == b {print $3}' "$out" | median)
	awk -v b="$b" -v o="$o" -v n="$n" 'BEGIN {printf "%-32s %14.0f %14.0f %8.2f\n", b, o, n, n / o}'
done
rm -f "$out"
