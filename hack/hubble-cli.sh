#!/usr/bin/env bash
# Builds the stock hubble CLI from the github.com/cilium/cilium module zip at a
# pinned version into a cache outside the repository:
#   ${TENDRIL_CACHE:-$HOME/.cache/tendril}/bin/hubble-<version>
# The tests of pkg/hubble and pkg/cli drive this binary against Tendril's
# observer server, so compatibility is checked against the real client.
# `go install` refuses cilium (its go.mod has replace directives), so the
# module directory is copied to a writable scratch place and built there,
# after pinning k8s.io/apimachinery to a version that the proxy serves and
# that builds with the rest of cilium's dependency graph.
# Idempotent: an existing binary is kept. Cold: about four minutes.
#
#   hack/hubble-cli.sh              build if missing, print the binary's path
#   hack/hubble-cli.sh --print-path print the binary's path
set -euo pipefail

VERSION=${HUBBLE_CILIUM_VERSION:-v1.18.8}
APIMACHINERY=${HUBBLE_APIMACHINERY_VERSION:-v0.33.9}
CACHE=${TENDRIL_CACHE:-$HOME/.cache/tendril}
BIN=$CACHE/bin
OUT=$BIN/hubble-$VERSION

if [[ ${1:-} == --print-path ]]; then
	echo "$OUT"
	exit 0
fi
log() { echo "hubble-cli: $*" >&2; }
if [[ -x $OUT ]]; then
	echo "$OUT"
	exit 0
fi
mkdir -p "$BIN" "$CACHE/scratch"
scratch=$CACHE/scratch/cilium-$VERSION
log "building hubble from github.com/cilium/cilium@$VERSION (about four minutes the first time)"
if [[ ! -f $scratch/go.mod ]]; then
	dir=$(cd "$CACHE/scratch" && GOFLAGS=-mod=mod go mod download -json "github.com/cilium/cilium@$VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
	[[ -d $dir ]] || { log "cannot download github.com/cilium/cilium@$VERSION"; exit 1; }
	rm -rf "$scratch.tmp"
	cp -r "$dir" "$scratch.tmp"
	chmod -R u+w "$scratch.tmp"
	(cd "$scratch.tmp" && go mod edit -replace "k8s.io/apimachinery=k8s.io/apimachinery@$APIMACHINERY")
	mv "$scratch.tmp" "$scratch"
fi
(cd "$scratch" && GOFLAGS=-mod=mod GOWORK=off go build -trimpath -ldflags "-s -w" -o "$OUT.tmp" ./hubble)
mv "$OUT.tmp" "$OUT"
log "built $OUT"
echo "$OUT"
