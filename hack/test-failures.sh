#!/usr/bin/env bash
# Prints what each failed test logged: for every top-level "--- FAIL: Name"
# in a `go test -v` log, the lines from its "=== RUN   Name" to that line,
# its last 80 when longer. Why: under -v a test's subtests and their
# errors stream before the parent's FAIL line, so a fixed context around
# that line (the old grep -B2) showed two log lines and not the error.
# A panic's first 30 lines are printed as they come.
# Usage: test-failures.sh LOG
set -uo pipefail
log=${1:?log file}
awk '
	/^=== RUN   / {
		name = $3
		if (name !~ /\//) { cur = name; n = 0 }
	}
	cur != "" { buf[n++] = $0 }
	/^--- FAIL: / {
		name = $3
		if (name == cur) {
			from = n > 80 ? n - 80 : 0
			print "---- " cur " (" n " lines" (from > 0 ? ", the last 80" : "") "):"
			for (i = from; i < n; i++) print buf[i]
			cur = ""; n = 0
		}
	}
	/^panic: / { panicked = 30 }
	panicked > 0 { print; panicked-- }
	/^(ok|FAIL)[ \t]/ { cur = ""; n = 0 }
	/^FAIL[ \t]/ { print }
' "$log"
