#!/usr/bin/env bash
# Removes whatever an interrupted demo left: processes, namespaces, pinned maps.
set -uo pipefail
pkill -f -- "--bpf-root /sys/fs/bpf/tendril-demo" 2>/dev/null
for ns in tdrdemo-node tdrdemo-frontend tdrdemo-backend tdrdemo-other; do
	pids=$(ip netns pids "$ns" 2>/dev/null)
	[[ -n $pids ]] && kill $pids 2>/dev/null
	ip netns del "$ns" 2>/dev/null
done
rm -rf /sys/fs/bpf/tendril-demo
exit 0
