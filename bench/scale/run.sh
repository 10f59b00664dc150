#!/usr/bin/env bash
# Runs the scale benchmark (root): one real tendril-agent with its datapath
# in a network namespace of its own, against a real kube-apiserver + etcd
# holding a simulated 1,000-node, 50,000-pod cluster, in CRD and kvstore
# identity mode, and tendril-operator on the same data. Builds what it
# needs and prints Markdown for docs/benchmarks.md. Flags go to
# bench/scale (-nodes, -pods, -apps, -services, -policies, -local,
# -new-pods, -churn-rate, -churn, -modes, -heap-profiles, -settle, -agents:
# e.g. -agents old=/tmp/old-agent,new=bin/tendril-agent measures two
# agent binaries one after the other in each mode against the same cluster).
set -euo pipefail
cd "$(dirname "$0")/../.."
hack/install-deps.sh >/dev/null
hack/k8s-binaries.sh
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
go build -o bin/tendril-agent ./cmd/tendril-agent
go build -o bin/tendril-cni ./cmd/tendril-cni
go build -o bin/tendril-operator ./cmd/tendril-operator
go build -o bin/scale-bench ./bench/scale
exec bin/scale-bench -agent bin/tendril-agent -cni bin/tendril-cni -operator bin/tendril-operator "$@"
