#!/usr/bin/env bash
# Builds the stock cilium-dbg CLI from the github.com/cilium/cilium module zip at
# a pinned version into a cache outside the repository:
#   ${TENDRIL_CACHE:-$HOME/.cache/tendril}/bin/cilium-dbg-<version>
# Tests drive this binary against a Tendril agent's API (`cilium-dbg service
# list`), so compatibility is checked against the real client. The module is
# built in the same scratch copy as hack/hubble-cli.sh (go install refuses
# cilium: its go.mod has replace directives; k8s.io/apimachinery is pinned to a
# version the proxy serves). Idempotent: an existing binary is kept. Cold:
# several minutes.
#
#   hack/cilium-dbg.sh              build if missing, print the binary's path
#   hack/cilium-dbg.sh --print-path print the binary's path
set -euo pipefail

VERSION=${CILIUM_DBG_VERSION:-v1.18.8}
APIMACHINERY=${CILIUM_DBG_APIMACHINERY_VERSION:-v0.33.9}
CACHE=${TENDRIL_CACHE:-$HOME/.cache/tendril}
BIN=$CACHE/bin
OUT=$BIN/cilium-dbg-$VERSION

if [[ ${1:-} == --print-path ]]; then
	echo "$OUT"
	exit 0
fi
log() { echo "cilium-dbg: $*" >&2; }
if [[ -x $OUT ]]; then
	echo "$OUT"
	exit 0
fi
mkdir -p "$BIN" "$CACHE/scratch"
scratch=$CACHE/scratch/cilium-$VERSION
log "building cilium-dbg from github.com/cilium/cilium@$VERSION (several minutes the first time)"
if [[ ! -f $scratch/go.mod ]]; then
	dir=$(cd "$CACHE/scratch" && GOFLAGS=-mod=mod go mod download -json "github.com/cilium/cilium@$VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
	[[ -d $dir ]] || { log "cannot download github.com/cilium/cilium@$VERSION"; exit 1; }
	rm -rf "$scratch.tmp"
	cp -r "$dir" "$scratch.tmp"
	chmod -R u+w "$scratch.tmp"
	(cd "$scratch.tmp" && go mod edit -replace "k8s.io/apimachinery=k8s.io/apimachinery@$APIMACHINERY")
	mv "$scratch.tmp" "$scratch"
fi
# A per-process temporary name: another build of the same version may run at once.
tmp=$(mktemp "$OUT.XXXXXX")
(cd "$scratch" && GOFLAGS=-mod=mod GOWORK=off go build -trimpath -ldflags "-s -w" -o "$tmp" ./cilium-dbg)
mv "$tmp" "$OUT"
log "built $OUT"
echo "$OUT"
