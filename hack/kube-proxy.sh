#!/usr/bin/env bash
# Builds kube-proxy at a pinned version from the Go module proxy into the same
# cache as hack/k8s-binaries.sh:
#   ${TENDRIL_CACHE:-$HOME/.cache/tendril}/bin/kube-proxy-<version>
# and installs the userspace its modes need (iptables, nftables, conntrack)
# through hack/install-deps.sh when missing. Only the services benchmark
# (bench/services) uses it, always inside a network namespace of its own.
#
# `go install` refuses k8s.io/kubernetes (replace directives), so kube-proxy is
# built as a dependency of a scratch module like kube-apiserver, with every
# staging module k8s.io/X replaced by its published v0.<minor>.<patch> tag. The
# scratch module is its own directory (kube-proxy adds knftables, moby/ipvs and
# netlink to the go.sum) so the kube-apiserver one is never rewritten; the Go
# build cache is shared, so with kube-apiserver built it takes about 4 minutes.
# Idempotent: an existing binary is kept.
#
#   hack/kube-proxy.sh              build what is missing, print the binary's path
#   hack/kube-proxy.sh --print-path print the binary's path
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.36.3}
CACHE=${TENDRIL_CACHE:-$HOME/.cache/tendril}
BIN=$CACHE/bin
OUT=$BIN/kube-proxy-$K8S_VERSION
STAGING_VERSION=v0.${K8S_VERSION#v1.}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
log() { echo "kube-proxy: $*" >&2; }

if [[ ${1:-} == --print-path ]]; then
	echo "$OUT"
	exit 0
fi

# The userspace tools kube-proxy execs: iptables-restore/-save (iptables
# mode), nft (nftables mode), conntrack (stale UDP entries).
need=()
command -v iptables-restore >/dev/null || need+=(iptables)
command -v nft >/dev/null || need+=(nftables)
command -v conntrack >/dev/null || need+=(conntrack)
if ((${#need[@]} > 0)); then
	log "installing ${need[*]} (hack/install-deps.sh)"
	(cd "$HERE/.." && bash hack/install-deps.sh >&2)
fi

if [[ ! -x $OUT ]]; then
	mkdir -p "$BIN"
	mod=$CACHE/scratch/kube-proxy-$K8S_VERSION
	mkdir -p "$mod"
	log "building kube-proxy $K8S_VERSION (minutes the first time)"
	gomod=$(cd "$mod" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
	[[ -f $gomod ]] || { log "cannot read the go.mod of k8s.io/kubernetes@$K8S_VERSION"; exit 1; }
	{
		echo "module tendril.local/kube-proxy"
		echo
		echo "go 1.26"
		echo
		echo "require k8s.io/kubernetes $K8S_VERSION"
		echo
		echo "replace ("
		sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\t\1 => \1 '"$STAGING_VERSION"'#p' "$gomod"
		echo ")"
	} >"$mod/go.mod"
	cat >"$mod/tools.go" <<'GO'
//go:build tools

package tools

import _ "k8s.io/kubernetes/cmd/kube-proxy"
GO
	(cd "$mod" && GOFLAGS=-mod=mod go mod tidy >/dev/null 2>&1 || true)
	(cd "$mod" && GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$OUT.tmp" k8s.io/kubernetes/cmd/kube-proxy)
	mv "$OUT.tmp" "$OUT"
	log "built $OUT"
fi
echo "$OUT"
