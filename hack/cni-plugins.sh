#!/usr/bin/env bash
# Builds the reference CNI plugins (containernetworking/plugins: ptp and
# host-local) at a pinned version from the Go module proxy into a cache
# outside the repository, for the CNI ADD benchmark's same-run baseline:
#   ${TENDRIL_CACHE:-$HOME/.cache/tendril}/bin/cni-plugins-<version>/{ptp,host-local}
# Idempotent: existing binaries are kept.
#
#   hack/cni-plugins.sh              build what is missing
#   hack/cni-plugins.sh --print-dir  print the plugin directory
set -euo pipefail

VERSION=${CNI_PLUGINS_VERSION:-v1.9.1}
CACHE=${TENDRIL_CACHE:-$HOME/.cache/tendril}
DIR=$CACHE/bin/cni-plugins-$VERSION

if [[ ${1:-} == --print-dir ]]; then
	echo "$DIR"
	exit 0
fi
mkdir -p "$DIR"
for p in main/ptp ipam/host-local; do
	name=${p#*/}
	[[ -x $DIR/$name ]] && continue
	echo "cni-plugins: building $name $VERSION" >&2
	GOBIN=$DIR GOFLAGS= go install "github.com/containernetworking/plugins/plugins/$p@$VERSION"
done
echo "$DIR"
