#!/usr/bin/env bash
# Runs every fuzz target of hack/fuzz-targets.txt for FUZZTIME (first
# argument, e.g. 10m or 5s) each, one after the other with one worker (the
# machine is shared), and prints for each its package, name, executions and
# outcome. A crasher fails the run; Go writes it under the package's
# testdata/fuzz/<target>/, where it becomes a regression input once
# committed. Exits non-zero when any target failed.
#
# Go before 1.27 has a race in its fuzz coordinator (golang/go#75804): when
# -fuzztime runs out while a worker is mid-call, the run fails with a bare
# "context deadline exceeded" and writes no input. That outcome is not a
# finding, so it is told apart: no "Failing input written", the deadline as
# the only failure, and the target's corpus then replayed without fuzzing
# must pass. Anything else fails the run.
set -uo pipefail
fuzztime=${1:-10m}
cd "$(dirname "$0")/.."
GO=${GO:-go}
failed=()
start=$(date +%s)
while read -r pkg target mode; do
	[[ -z "$pkg" || "$pkg" == \#* ]] && continue
	if [[ "$mode" == long && -n "${FUZZ_SHORT:-}" ]]; then
		# Said, not skipped silently: its seed corpus ran as a test in go test.
		echo "--- fuzz $pkg $target: long run only (make fuzz); its seed corpus ran in go test"
		continue
	fi
	echo "==> fuzz $pkg $target ($fuzztime)"
	t0=$(date +%s)
	out=$("$GO" test "$pkg" -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" -parallel 1 2>&1)
	rc=$?
	race=false
	if [[ $rc -ne 0 ]] && ! grep -q 'Failing input written' <<<"$out" &&
		grep -qx '    context deadline exceeded' <<<"$out" &&
		[[ $(grep -c -- '--- FAIL' <<<"$out") -eq 1 ]]; then
		race=true
	fi
	if $race; then
		# Not a test failure: the lines say so, so that a summary of the
		# log (hack/test-summary.sh) does not count it as one.
		echo "$out" | tail -n 25 | sed -E 's/^--- FAIL: /--- FUZZ-COORDINATOR-RACE: /; s/^FAIL(\s)/FUZZ-COORDINATOR-RACE\1/; s/^FAIL$/FUZZ-COORDINATOR-RACE/'
	else
		echo "$out" | tail -n 25
	fi
	execs=$(echo "$out" | grep -oE 'execs: [0-9]+' | tail -1 | cut -d' ' -f2)
	# go test's own "ok/FAIL <pkg> <secs>s" is the test binary's run; the
	# rest of the target's time is the coverage-instrumented build of the
	# package and everything it imports, most of it on a loaded machine.
	total=$(( $(date +%s) - t0 ))
	ran=$(grep -oE '^(ok|FAIL)[[:space:]]+[^[:space:]]+[[:space:]]+[0-9.]+s' <<<"$out" | tail -1 | grep -oE '[0-9.]+s$' | tr -d s)
	echo "--- fuzz $pkg $target: rc=$rc, execs=${execs:-?}, ${total}s (test binary ${ran:-?}s, the rest building it)"
	if $race; then
		echo "--- fuzz $pkg $target: the fuzz coordinator's deadline race (golang/go#75804), no input written; replaying the corpus"
		if "$GO" test "$pkg" -run "^${target}\$" -count 1 >/dev/null 2>&1; then
			rc=0
		else
			echo "--- fuzz $pkg $target: the corpus replay failed"
		fi
	fi
	[[ $rc -ne 0 ]] && failed+=("$pkg $target")
done < hack/fuzz-targets.txt
echo "==> fuzz: $(( $(date +%s) - start ))s in all"
if [[ ${#failed[@]} -gt 0 ]]; then
	printf 'FAIL fuzz %s\n' "${failed[@]}"
	exit 1
fi
echo "ok fuzz: every target passed"
