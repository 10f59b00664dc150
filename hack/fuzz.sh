#!/usr/bin/env bash
# Runs every fuzz target of hack/fuzz-targets.txt for FUZZTIME (first
# argument, e.g. 10m or 5s) each, one after the other with one worker (the
# machine is shared), and prints for each its package, name, executions and
# outcome. A crasher fails the run; Go writes it under the package's
# testdata/fuzz/<target>/, where it becomes a regression input once
# committed. Exits non-zero when any target failed.
set -uo pipefail
fuzztime=${1:-10m}
cd "$(dirname "$0")/.."
GO=${GO:-go}
failed=()
start=$(date +%s)
while read -r pkg target; do
	[[ -z "$pkg" || "$pkg" == \#* ]] && continue
	echo "==> fuzz $pkg $target ($fuzztime)"
	t0=$(date +%s)
	out=$("$GO" test "$pkg" -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" -parallel 1 2>&1)
	rc=$?
	echo "$out" | tail -n 25
	execs=$(echo "$out" | grep -oE 'execs: [0-9]+' | tail -1 | cut -d' ' -f2)
	echo "--- fuzz $pkg $target: rc=$rc, execs=${execs:-?}, $(( $(date +%s) - t0 ))s"
	[[ $rc -ne 0 ]] && failed+=("$pkg $target")
done < hack/fuzz-targets.txt
echo "==> fuzz: $(( $(date +%s) - start ))s in all"
if [[ ${#failed[@]} -gt 0 ]]; then
	printf 'FAIL fuzz %s\n' "${failed[@]}"
	exit 1
fi
echo "ok fuzz: every target passed"
