#!/usr/bin/env bash
# Regenerates the eBPF objects and their Go bindings (bpf2go) from bpf/.
# Deterministic: the same sources give the same bytes.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang >/dev/null; then
	echo "generate-bpf: clang missing; run hack/install-deps.sh" >&2
	exit 1
fi
go generate ./pkg/datapath/bpf/...
