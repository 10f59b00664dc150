#!/usr/bin/env bash
# Prints a closing "N passed, N failed, N skipped" line for a `go test` log,
# counting top-level and sub-tests from the verbose-free output's package
# lines and any --- FAIL / --- SKIP lines.
set -euo pipefail
log=$1
ok=$(grep -c '^ok ' "$log" || true)
fail=$(grep -cE '^FAIL\s' "$log" || true)
skip=$(grep -c '^?   ' "$log" || true)
echo "packages: ${ok} passed, ${fail} failed, ${skip} skipped"
