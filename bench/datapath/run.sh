#!/usr/bin/env bash
# Runs the datapath benchmark (needs root, iperf3) and prints a Markdown row
# for docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
hack/install-deps.sh >/dev/null
exec go run ./bench/datapath "$@"
