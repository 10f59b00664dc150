#!/usr/bin/env bash
# Builds the stock cilium-cni plugin (github.com/cilium/cilium@v1.18.8,
# package plugins/cilium-cni) into a cache directory outside the repository,
# so the compatibility test can drive it against a Tendril agent. The module
# only builds inside a copy of itself with k8s.io/apimachinery pinned to
# v0.33.9 (see FACTS.md); the first build takes several minutes, later runs
# reuse the binary.
set -euo pipefail

VERSION=${CILIUM_VERSION:-v1.18.8}
CACHE=${TENDRIL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tendril}
OUT="$CACHE/cilium-cni-$VERSION/cilium-cni"

if [[ -x "$OUT" ]]; then
	echo "$OUT"
	exit 0
fi

mkdir -p "$CACHE"
# Outside any module, so the download cannot touch this repository's go.mod.
SRC=$(cd "$CACHE" && GO111MODULE=on GOFLAGS= go mod download -json "github.com/cilium/cilium@$VERSION" |
	sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[[ -d "$SRC" ]] || { echo "download of cilium $VERSION failed" >&2; exit 1; }
WORK=$(mktemp -d "$CACHE/cilium-src-XXXXXX")
trap 'chmod -R u+w "$WORK" 2>/dev/null; rm -rf "$WORK"' EXIT

cp -r "$SRC/." "$WORK/"
chmod -R u+w "$WORK"
cd "$WORK"
go mod edit -replace k8s.io/apimachinery=k8s.io/apimachinery@v0.33.9
GOFLAGS=-mod=mod go build -o "$OUT.tmp" ./plugins/cilium-cni >&2
mv "$OUT.tmp" "$OUT"
echo "$OUT"
