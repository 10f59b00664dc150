#!/usr/bin/env bash
# Builds a stock client of the github.com/cilium/cilium module (hubble or
# cilium-dbg) at a pinned version into a cache outside the repository:
#   ${TENDRIL_CACHE:-$HOME/.cache/tendril}/bin/<binary>-<version>
# Tests drive these binaries against Tendril (the observer server, the
# agent's API), so compatibility is checked against the real clients.
# `go install` refuses cilium (its go.mod has replace directives), so the
# module directory is copied once to a writable scratch place, shared by
# both tools, and built there after pinning k8s.io/apimachinery to a
# version that the proxy serves and that builds with the rest of cilium's
# dependency graph. Idempotent: an existing binary is kept. Cold: about
# four minutes.
#
#   hack/cilium-tool.sh TOOL [--print-path]   TOOL: hubble or cilium-dbg
# (hack/hubble-cli.sh and hack/cilium-dbg.sh call it.)
set -euo pipefail

TOOL=${1:?usage: cilium-tool.sh hubble|cilium-dbg [--print-path]}
shift
case $TOOL in
hubble | cilium-dbg) ;;
*)
	echo "cilium-tool: unknown tool $TOOL (hubble or cilium-dbg)" >&2
	exit 2
	;;
esac
VERSION=${CILIUM_TOOL_VERSION:-v1.18.8}
APIMACHINERY=${CILIUM_TOOL_APIMACHINERY_VERSION:-v0.33.9}
CACHE=${TENDRIL_CACHE:-$HOME/.cache/tendril}
BIN=$CACHE/bin
OUT=$BIN/$TOOL-$VERSION

if [[ ${1:-} == --print-path ]]; then
	echo "$OUT"
	exit 0
fi
log() { echo "$TOOL: $*" >&2; }
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
scratch=$CACHE/scratch/cilium-$VERSION
log "building $TOOL from github.com/cilium/cilium@$VERSION (about four minutes the first time)"
if [[ ! -f $scratch/go.mod ]]; then
	dir=$(cd "$CACHE/scratch" && GOFLAGS=-mod=mod go mod download -json "github.com/cilium/cilium@$VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
	[[ -d $dir ]] || { log "cannot download github.com/cilium/cilium@$VERSION"; exit 1; }
	# A per-process temporary copy: the other tool's build may copy too.
	tmpdir=$(mktemp -d "$scratch.tmp.XXXXXX")
	cp -r "$dir/." "$tmpdir"
	chmod -R u+w "$tmpdir"
	(cd "$tmpdir" && go mod edit -replace "k8s.io/apimachinery=k8s.io/apimachinery@$APIMACHINERY")
	mv -T "$tmpdir" "$scratch" 2>/dev/null || rm -rf "$tmpdir"
fi
# A per-process temporary name: another build of the same tool may run at once.
tmp=$(mktemp "$OUT.XXXXXX")
(cd "$scratch" && GOFLAGS=-mod=mod GOWORK=off go build -trimpath -ldflags "-s -w" -o "$tmp" "./$TOOL")
mv "$tmp" "$OUT"
log "built $OUT"
echo "$OUT"
