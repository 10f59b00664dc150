#!/usr/bin/env bash
# Runs the services benchmark (root): Tendril against kube-proxy v1.36.3 in
# iptables and nftables mode, in one run, on network namespaces of its own
# and a real kube-apiserver + etcd. Builds what it needs (the agent,
# kube-proxy from the Go module proxy, the control plane binaries) and
# prints Markdown for docs/benchmarks.md. Flags go to bench/services
# (-sizes, -modes, -program-size, -connects, -changes, -iperf-seconds).
set -euo pipefail
cd "$(dirname "$0")/../.."
hack/install-deps.sh >/dev/null
hack/k8s-binaries.sh
kube_proxy=$(hack/kube-proxy.sh)
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
go build -o bin/tendril-agent ./cmd/tendril-agent
go build -o bin/services-bench ./bench/services
exec bin/services-bench -agent bin/tendril-agent -kube-proxy "$kube_proxy" "$@"
