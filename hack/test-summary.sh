#!/usr/bin/env bash
# Summarizes a `go test -v` log: prints the package results, every failed or
# skipped test, and a closing "N passed, N failed, N skipped" line counting
# tests and subtests.
set -euo pipefail
log=$1
grep -E '^(ok|FAIL|---|panic:|\?)' "$log" | grep -vE -- '--- PASS' || true
# A skip line is indented for subtests; count all levels.
passed=$(grep -cE '^\s*--- PASS' "$log" || true)
failed=$(grep -cE '^\s*--- FAIL' "$log" || true)
skipped=$(grep -cE '^\s*--- SKIP' "$log" || true)
build_failed=$(grep -cE '^FAIL\s.*\[(build|setup) failed\]' "$log" || true)
failed=$((failed + build_failed))
echo "tests: ${passed} passed, ${failed} failed, ${skipped} skipped"
