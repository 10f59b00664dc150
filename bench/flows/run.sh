#!/usr/bin/env bash
# Runs the flows benchmark (needs root, iperf3): TCP throughput and new
# connection rate with flows on against off, in the same run; prints
# Markdown rows for docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
hack/install-deps.sh >/dev/null
exec go run ./bench/flows "$@"
