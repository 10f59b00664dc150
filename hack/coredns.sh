#!/usr/bin/env bash
# Builds CoreDNS at a pinned version from its Go module zip (the Go module
# proxy) into a cache outside the repository:
#   ${TENDRIL_CACHE:-$HOME/.cache/tendril}/bin/coredns-<version>
# The lab runs it as the cluster's DNS (the kube-dns Service, docs/lab.md).
# CoreDNS's go.mod has no replace directives, so the module is built as it
# was published: `go mod download -json` fetches and verifies the zip, and
# `go build` runs in the extracted module directory with its own go.mod and
# go.sum (read-only mode: nothing in the module cache is written). The
# plugin set is CoreDNS's default (plugin.cfg), which has kubernetes.
# Idempotent: an existing binary is kept, so a second run takes moments.
# Cold: a few minutes (most of it compiling the cloud plugins' SDKs).
#
#   hack/coredns.sh              build if missing, print the binary's path
#   hack/coredns.sh --print-path print the binary's path
set -euo pipefail

VERSION=${COREDNS_VERSION:-v1.15.0}
CACHE=${TENDRIL_CACHE:-$HOME/.cache/tendril}
BIN=$CACHE/bin
OUT=$BIN/coredns-$VERSION

if [[ ${1:-} == --print-path ]]; then
	echo "$OUT"
	exit 0
fi
log() { echo "coredns: $*" >&2; }
if [[ -x $OUT ]]; then
	echo "$OUT"
	exit 0
fi
mkdir -p "$BIN" "$CACHE/scratch"
# One build at a time per cache: two runs (parallel test packages, two
# checkouts) would otherwise write the same .tmp file and race on its rename.
exec 9>"$CACHE/.build.lock"
flock 9
# Another run may have built it while this one waited.
if [[ -x $OUT ]]; then
	echo "$OUT"
	exit 0
fi
log "building CoreDNS from github.com/coredns/coredns@$VERSION (a few minutes the first time)"
# go mod download needs a module to run in outside GOPATH mode: an empty
# scratch directory is enough for a versioned download.
dir=$(cd "$CACHE/scratch" && GOFLAGS=-mod=mod GOWORK=off go mod download -json "github.com/coredns/coredns@$VERSION" |
	sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
[[ -f $dir/go.mod ]] || { log "cannot download github.com/coredns/coredns@$VERSION"; exit 1; }
(cd "$dir" && GOFLAGS=-mod=readonly GOWORK=off go build -trimpath -ldflags "-s -w" -o "$OUT.tmp" .)
mv "$OUT.tmp" "$OUT"
log "built $OUT"
echo "$OUT"
