#!/usr/bin/env bash
# Removes the demo's lab (tendril lab down: processes, network namespaces,
# pinned BPF objects, the lab directory). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ! -x bin/tendril ]]; then
	make build
fi
bin/tendril lab down
