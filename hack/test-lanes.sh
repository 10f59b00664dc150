#!/usr/bin/env bash
# The test phases of `make test` in two lanes that run side by side, each
# logging to a file of its own, joined into one log at the end:
#   lane 1: the lab tests of test/e2e (the longest package by far), then
#           test/e2e/containerd's lab, then fuzz-short;
#   lane 2: every other package (-p 1, as before: the privileged packages
#           share the machine's kernel with each other), then the race run
#           and bench-smoke.
# The containerd lab sits in lane 1 for balance: in the first CI runs with
# lanes, lane 2 took ≈3,140 s (packages ≈2,580, race ≈455, bench-smoke
# ≈107) against lane 1's ≈2,400 (test/e2e 2,241, fuzz-short ≈155), and the
# containerd lab is lane 2's longest package (≈300 s). The race run and
# bench-smoke stay behind lane 2's packages: they run some of the same
# privileged tests, which use the same names and pins each time they run.
# Why: run one after another the phases took about 64 of CI's 70 minutes on
# this machine's two cores, and test/e2e alone 27 of them, most of it spent
# waiting (API servers and agents starting, probes timing out, captures),
# so the other packages fit beside it. The lanes share nothing a test
# holds: the e2e labs live in network namespaces of their own under their
# own names (test/e2e/containerd's lab has another name), and every
# privileged test outside them makes its own namespaces and pins.
#
# Usage: test-lanes.sh LOG  (GO, BIN_DIR, RACE_PACKAGES from the Makefile)
# Exits non-zero when any phase failed; prints each phase's time.
set -uo pipefail
log=${1:?log file}
go=${GO:-go}
bin=${BIN_DIR:?BIN_DIR}
race=${RACE_PACKAGES:?RACE_PACKAGES}
lane1=$log.lane1
lane2=$log.lane2
times=$(mktemp)
trap 'rm -f "$times" "$lane1" "$lane2"' EXIT

e2e=./test/e2e
containerd=./test/e2e/containerd
others=$("$go" list ./... | grep -vxF -e "$("$go" list "$e2e")" -e "$("$go" list "$containerd")")

lane_e2e() {
	local status=0 a b c d
	a=$(date +%s)
	TENDRIL_BIN_DIR=$bin "$go" test -p 1 -v -count=1 -timeout 50m "$e2e" >"$lane1" 2>&1 || status=1
	b=$(date +%s)
	TENDRIL_BIN_DIR=$bin "$go" test -p 1 -v -count=1 -timeout 30m "$containerd" >>"$lane1" 2>&1 || status=1
	c=$(date +%s)
	make --no-print-directory fuzz-short >>"$lane1" 2>&1 || status=1
	d=$(date +%s)
	echo "lane 1: go test test/e2e $((b - a)) s, test/e2e/containerd $((c - b)) s, fuzz-short $((d - c)) s" >>"$times"
	return $status
}

lane_rest() {
	local status=0 a b c d
	a=$(date +%s)
	# shellcheck disable=SC2086 # one package path per word
	TENDRIL_BIN_DIR=$bin "$go" test -p 1 -v -count=1 -timeout 50m $others >"$lane2" 2>&1 || status=1
	b=$(date +%s)
	# shellcheck disable=SC2086
	"$go" test -race -v -count=1 -timeout 20m $race >>"$lane2" 2>&1 || status=1
	c=$(date +%s)
	make --no-print-directory bench-smoke >>"$lane2" 2>&1 || status=1
	d=$(date +%s)
	echo "lane 2: go test (other packages) $((b - a)) s, race $((c - b)) s, bench-smoke $((d - c)) s" >>"$times"
	return $status
}

start=$(date +%s)
lane_e2e &
e2e_pid=$!
status=0
lane_rest || status=1
wait "$e2e_pid" || status=1
cat "$lane2" "$lane1" >"$log"
echo "==> phases (two lanes side by side, $(($(date +%s) - start)) s in all):"
sed 's/^/    /' "$times"
exit $status
