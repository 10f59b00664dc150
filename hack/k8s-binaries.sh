#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager, kubectl and etcd at pinned versions
# from the Go module proxy into a cache outside the repository:
#   ${TENDRIL_CACHE:-$HOME/.cache/tendril}/bin/<component>-<version>
# `go install` refuses both projects (their go.mod files use replace
# directives), so each is built as a dependency of a scratch module: for
# Kubernetes, one that replaces every staging module k8s.io/X with its
# published v0.<minor>.<patch> tag. Idempotent: existing binaries are kept,
# so a second run takes a second. Cold: several minutes per component.
#
#   hack/k8s-binaries.sh              build what is missing
#   hack/k8s-binaries.sh --print-dir  print the binary directory
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.36.3}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
CACHE=${TENDRIL_CACHE:-$HOME/.cache/tendril}
BIN=$CACHE/bin
STAGING_VERSION=v0.${K8S_VERSION#v1.}

if [[ ${1:-} == --print-dir ]]; then
	echo "$BIN"
	exit 0
fi
mkdir -p "$BIN"
# One build at a time per cache: two runs (parallel test packages, two
# checkouts) would otherwise write the same .tmp file and race on its rename.
exec 9>"$CACHE/.build.lock"
flock 9
log() { echo "k8s-binaries: $*" >&2; }

# stamped BINARY: whether the binary reports K8S_VERSION. Binaries built
# before this script stamped the version (-X of component-base/version, as
# Kubernetes' Makefile does) report v0.0.0-master, which helm's kubeVersion
# check of the chart refuses: they are rebuilt once.
stamped() {
	local out
	case $1 in
	kubectl) out=$("$BIN/$1-$K8S_VERSION" version --client 2>/dev/null) || return 1 ;;
	*) out=$("$BIN/$1-$K8S_VERSION" --version 2>/dev/null) || return 1 ;;
	esac
	[[ $out == *"$K8S_VERSION"* ]]
}

build_kubernetes() {
	local want=()
	for c in kube-apiserver kube-controller-manager kubectl; do
		[[ -x $BIN/$c-$K8S_VERSION ]] && stamped "$c" || want+=("$c")
	done
	((${#want[@]} == 0)) && return 0
	local mod=$CACHE/scratch/kubernetes-$K8S_VERSION
	mkdir -p "$mod"
	log "building ${want[*]} $K8S_VERSION (several minutes the first time)"
	local gomod
	gomod=$(cd "$mod" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
	[[ -f $gomod ]] || { log "cannot read the go.mod of k8s.io/kubernetes@$K8S_VERSION"; exit 1; }
	{
		echo "module tendril.local/k8s-binaries"
		echo
		echo "go 1.26"
		echo
		echo "require k8s.io/kubernetes $K8S_VERSION"
		echo
		echo "replace ("
		# The staging modules are the ones its own go.mod replaces with ./staging paths.
		sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\t\1 => \1 '"$STAGING_VERSION"'#p' "$gomod"
		echo ")"
	} >"$mod/go.mod"
	cat >"$mod/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
	(cd "$mod" && GOFLAGS=-mod=mod go mod tidy >/dev/null 2>&1 || true)
	local minor=${K8S_VERSION#v1.}
	minor=${minor%%.*}
	local v=k8s.io/component-base/version
	local ldflags="-s -w -X $v.gitVersion=$K8S_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean"
	for c in "${want[@]}"; do
		log "go build k8s.io/kubernetes/cmd/$c"
		(cd "$mod" && GOFLAGS=-mod=mod go build -trimpath -ldflags "$ldflags" -o "$BIN/$c-$K8S_VERSION.tmp" "k8s.io/kubernetes/cmd/$c")
		mv "$BIN/$c-$K8S_VERSION.tmp" "$BIN/$c-$K8S_VERSION"
		log "built $BIN/$c-$K8S_VERSION"
	done
}

build_etcd() {
	[[ -x $BIN/etcd-$ETCD_VERSION ]] && return 0
	local mod=$CACHE/scratch/etcd-$ETCD_VERSION
	mkdir -p "$mod"
	log "building etcd $ETCD_VERSION (about two minutes the first time)"
	cat >"$mod/go.mod" <<GOMOD
module tendril.local/etcd-binary

go 1.26

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
GOMOD
	cat >"$mod/tools.go" <<'GO'
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
GO
	(cd "$mod" && GOFLAGS=-mod=mod go mod tidy >/dev/null 2>&1 || true)
	(cd "$mod" && GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$BIN/etcd-$ETCD_VERSION.tmp" go.etcd.io/etcd/server/v3)
	mv "$BIN/etcd-$ETCD_VERSION.tmp" "$BIN/etcd-$ETCD_VERSION"
	log "built $BIN/etcd-$ETCD_VERSION"
}

build_etcd
build_kubernetes
log "binaries in $BIN"
