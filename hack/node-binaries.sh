#!/usr/bin/env bash
# Builds the node software of the lab's real-node mode (`tendril lab up
# --runtime containerd`) at pinned versions from the Go module proxy into the
# cache outside the repository, like hack/k8s-binaries.sh does for the control
# plane:
#   ${TENDRIL_CACHE:-$HOME/.cache/tendril}/bin/kubelet-<version>
#   ${TENDRIL_CACHE:-$HOME/.cache/tendril}/bin/kube-scheduler-<version>
#   ${TENDRIL_CACHE:-$HOME/.cache/tendril}/bin/containerd-<version>
#   ${TENDRIL_CACHE:-$HOME/.cache/tendril}/bin/ctr-<version>
#   ${TENDRIL_CACHE:-$HOME/.cache/tendril}/bin/containerd-shim-runc-v2-<version>
#   ${TENDRIL_CACHE:-$HOME/.cache/tendril}/bin/cni-plugins-<version>/loopback
# and makes sure runc is installed (Debian's package: containerd's runc shim
# runs it from PATH).
# The kubelet and kube-scheduler are built in hack/k8s-binaries.sh's scratch module (the one whose
# go.mod replaces the staging modules with their published tags); containerd
# in a scratch module of its own that requires it (its go.mod has replace
# directives too, so `go install` refuses it). no_btrfs: the btrfs snapshotter
# needs the btrfs C headers and the lab uses overlayfs.
# Idempotent: existing binaries are kept. Cold: several minutes.
#
#   hack/node-binaries.sh              build what is missing
#   hack/node-binaries.sh --print-dir  print the binary directory
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.36.3}
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.2.1}
CNI_PLUGINS_VERSION=${CNI_PLUGINS_VERSION:-v1.9.1}
CACHE=${TENDRIL_CACHE:-$HOME/.cache/tendril}
BIN=$CACHE/bin
HERE=$(cd "$(dirname "$0")" && pwd)

if [[ ${1:-} == --print-dir ]]; then
	echo "$BIN"
	exit 0
fi
log() { echo "node-binaries: $*" >&2; }

ensure_runc() {
	command -v runc >/dev/null && return 0
	[[ $(id -u) -eq 0 ]] || { log "runc is missing: as root, apt-get install runc"; exit 1; }
	log "installing Debian's runc"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runc >/dev/null
}

# build_kube builds the node-side Kubernetes binaries: the kubelet, and
# kube-scheduler (the lab's control plane runs none by default; a real
# node's DaemonSet pods need one to be bound). Their version is stamped as
# Kubernetes' Makefile does (-X of component-base/version): the kubelet
# reports it as the Node's kubeletVersion.
build_kube() {
	local want=()
	for c in kubelet kube-scheduler; do
		[[ -x $BIN/$c-$K8S_VERSION ]] || want+=("$c")
	done
	((${#want[@]} == 0)) && return 0
	local mod=$CACHE/scratch/kubernetes-$K8S_VERSION
	# hack/k8s-binaries.sh makes the module when it builds the control
	# plane; a cache holding only its binaries has none.
	[[ -f $mod/go.mod ]] || {
		log "$mod/go.mod missing (hack/k8s-binaries.sh makes it when it builds the control plane): rm $BIN/kube-apiserver-$K8S_VERSION and run again"
		exit 1
	}
	cat >"$mod/node_tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
GO
	local minor=${K8S_VERSION#v1.}
	minor=${minor%%.*}
	local v=k8s.io/component-base/version
	local ldflags="-s -w -X $v.gitVersion=$K8S_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean"
	local c
	for c in "${want[@]}"; do
		log "go build k8s.io/kubernetes/cmd/$c $K8S_VERSION"
		(cd "$mod" && GOFLAGS=-mod=mod go build -trimpath -ldflags "$ldflags" -o "$BIN/$c-$K8S_VERSION.tmp" "k8s.io/kubernetes/cmd/$c")
		mv "$BIN/$c-$K8S_VERSION.tmp" "$BIN/$c-$K8S_VERSION"
		log "built $BIN/$c-$K8S_VERSION"
	done
}

build_containerd() {
	[[ -x $BIN/containerd-$CONTAINERD_VERSION && -x $BIN/ctr-$CONTAINERD_VERSION ]] && return 0
	local mod=$CACHE/scratch/containerd-$CONTAINERD_VERSION
	mkdir -p "$mod"
	log "building containerd and ctr $CONTAINERD_VERSION (a few minutes the first time)"
	cat >"$mod/go.mod" <<GOMOD
module tendril.local/containerd-binaries

go 1.26

require github.com/containerd/containerd/v2 $CONTAINERD_VERSION
GOMOD
	cat >"$mod/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
GO
	(cd "$mod" && GOFLAGS=-mod=mod go mod tidy -tags tools >/dev/null 2>&1 || true)
	local c
	for c in containerd ctr containerd-shim-runc-v2; do
		(cd "$mod" && GOFLAGS=-mod=mod go build -tags no_btrfs -trimpath -ldflags "-s -w" -o "$BIN/$c-$CONTAINERD_VERSION.tmp" "github.com/containerd/containerd/v2/cmd/$c")
		mv "$BIN/$c-$CONTAINERD_VERSION.tmp" "$BIN/$c-$CONTAINERD_VERSION"
		log "built $BIN/$c-$CONTAINERD_VERSION"
	done
}

# build_loopback: containerd's CRI runs the reference loopback CNI plugin
# in every pod sandbox besides the network's own plugins; it goes beside
# hack/cni-plugins.sh's ptp and host-local.
build_loopback() {
	local dir=$BIN/cni-plugins-$CNI_PLUGINS_VERSION
	[[ -x $dir/loopback ]] && return 0
	mkdir -p "$dir"
	log "building the loopback CNI plugin $CNI_PLUGINS_VERSION"
	(cd "$CACHE/scratch" && GOBIN=$dir GOFLAGS= GOWORK=off CGO_ENABLED=0 go install "github.com/containernetworking/plugins/plugins/main/loopback@$CNI_PLUGINS_VERSION")
}

mkdir -p "$BIN" "$CACHE/scratch"
ensure_runc
# The kubelet's scratch module (and the control plane binaries) first: that
# script takes the build lock itself.
K8S_VERSION=$K8S_VERSION "$HERE/k8s-binaries.sh"
# One build at a time per cache (see hack/k8s-binaries.sh).
exec 9>"$CACHE/.build.lock"
flock 9
build_containerd
build_kube
build_loopback
log "binaries in $BIN"
