#!/usr/bin/env bash
# Regenerates the eBPF objects and their Go bindings (bpf2go) from bpf/, and
# the Go constants of the values C and Go share (bpf/lib/enums.h →
# pkg/datapath/maps/enums_gen.go, hack/bpfenums). Deterministic: the same
# sources give the same bytes.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang >/dev/null; then
	echo "generate-bpf: clang missing; run hack/install-deps.sh" >&2
	exit 1
fi
# Every header under bpf/lib/ must compile on its own, so that another
# program can include just the ones it needs (lib/maps.h for the shared
# maps).
for h in bpf/lib/*.h; do
	printf '#include "%s"\n' "${h#bpf/}" |
		clang -target bpf -O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu -Ibpf -x c -c - -o /dev/null ||
		{ echo "generate-bpf: $h does not compile on its own" >&2; exit 1; }
done
go generate ./pkg/datapath/bpf/... ./pkg/datapath/maps/...
# A second object built from the shared headers, for the test that two
# objects share the pinned maps (pkg/datapath/bpf/shared_maps_test.go).
# Relative paths and a fixed compilation directory keep its bytes the same
# wherever the repository is checked out; DWARF is stripped (BTF stays).
clang -target bpf -O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu -Ibpf -fdebug-compilation-dir . \
	-c pkg/datapath/bpf/testdata/shared_maps.c -o pkg/datapath/bpf/testdata/shared_maps.o
llvm-strip -g pkg/datapath/bpf/testdata/shared_maps.o
