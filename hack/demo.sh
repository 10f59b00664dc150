#!/usr/bin/env bash
# The demo: a two-node lab (a real Kubernetes API server, nodes and pods as
# network namespaces, a tendril-agent per node), a small app from
# examples/lab, real traffic between pods on one node and across nodes, a
# Service answering at its ClusterIP (translated by Tendril, no kube-proxy) and
# by name through the cluster DNS (CoreDNS as kube-dns), a
# TendrilNetworkPolicy that lets only the frontend reach the backend, and
# what Tendril shows about it. Needs root. The lab stays up for you to try
# things; `make demo-down` (tendril lab down) removes it. Every probe is
# compared with what the policy in force says: a mismatch, or a probe that
# could not be made, fails the run (exit 1).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $(id -u) -ne 0 ]]; then
	echo "demo: needs root (network namespaces, eBPF)" >&2
	exit 1
fi
T=bin/tendril
# TENDRIL_LAB picks the lab (default tdrlab), as for every lab command.
LAB=${TENDRIL_LAB:-tdrlab}
KUBECTL=$(hack/k8s-binaries.sh --print-dir)/kubectl-v1.36.3
step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

step "tendril lab up: control plane, 2 nodes with a tendril-agent each, 6 pods"
$T lab up --nodes 2 --pods-per-node 3
eval "$($T lab env)"
k() { "$KUBECTL" "$@"; }
node1="-H $TENDRIL_SOCK_NODE1"

step "The demo app (examples/lab/demo-app.yaml): backend, frontend, other on node1; far on node2"
k apply -f examples/lab/demo-app.yaml
k wait -n demo --for=condition=Ready pod --all --timeout=60s >/dev/null
k get pods -n demo -o wide
k get endpointslices -n demo
backend=$(k get pod -n demo backend -o jsonpath='{.status.podIP}')

# shellcheck source=hack/demo-lib.sh
. hack/demo-lib.sh # probe, svcprobe: each outcome compared with the expected one
step "Traffic: same node and across nodes, TCP and UDP"
probe frontend 80 connected
probe other 80 connected
probe frontend 53 connected --udp
probe far 80 connected
$T lab exec demo/frontend -- curl -s "http://$backend/" | sed 's/^/  curl from the frontend: /'

step "A Service: demo/backend answers at its ClusterIP, from node1 and from node2"
cip=$(k get service -n demo backend -o jsonpath='{.spec.clusterIP}')
k get service -n demo backend
k get endpointslices -n demo -l kubernetes.io/service-name=backend
svcprobe frontend connected
svcprobe far connected
demo_verdict
$T lab exec demo/far -- curl -s "http://$cip/" | sed 's/^/  curl from far (node2) to the ClusterIP: /'
echo "  node2's agent: the Service and its backend as the datapath has them"
$T -H "$TENDRIL_SOCK_NODE2" service list
$T bpf lb list --bpf-root "/sys/fs/bpf/tendril-lab/$LAB/node2"

step "Cluster DNS: CoreDNS behind kube-system/kube-dns at 10.96.0.10; pods reach the Service by name"
k get service -n kube-system kube-dns
k get endpointslices -n kube-system -l kubernetes.io/service-name=kube-dns
$T lab exec demo/far -- cat /etc/resolv.conf | sed 's/^/  demo\/far resolv.conf: /'
$T lab exec demo/far -- getent hosts backend | sed 's/^/  getent hosts backend (from far, node2): /'
$T lab exec demo/far -- curl -s http://backend/ | sed 's/^/  curl http:\/\/backend\/ from far (node2): /'
for args in "demo/frontend backend:80" "demo/far backend.demo.svc.cluster.local:80 --dns-tcp"; do
	# shellcheck disable=SC2086 # the words are the probe's arguments
	$T lab probe $args | sed 's/^/  /'
done
ver=$($T lab exec demo/frontend -- curl -s --cacert "/var/run/tendril-lab/$LAB/pki/ca.crt" https://kubernetes.default/version |
	grep -E '"(major|minor)"' | tr -d '\n ')
echo "  https://kubernetes.default/version from the frontend (the kubernetes Service, TLS verified for the name): {${ver%,}}"

step "Policy: the backend accepts only the frontend, on 80/TCP (examples/lab/allow-frontend.yaml)"
# Applies it and compares each probe with what it says; fails on a mismatch
# (TENDRIL_DEMO_DELETE_POLICY=1 deletes it first: then the demo must fail).
TENDRIL=$T hack/demo-policy.sh
$T $node1 policy trace --src k8s:app=other,k8s:io.kubernetes.pod.namespace=demo \
	--dst k8s:app=backend,k8s:io.kubernetes.pod.namespace=demo --dport 80/TCP || true

step "The datapath's view on node1: policy entries in the pinned BPF maps"
$T bpf policy list --bpf-root "/sys/fs/bpf/tendril-lab/$LAB/node1"

step "tendril connectivity test: its own pods on both nodes, traffic and policy cases"
$T connectivity test --lab "$LAB"

step "Flows on node1: the denied connection (other -> backend:80) names the policy that decided"
$T lab probe demo/other "$backend:80" --timeout 200ms >/dev/null 2>&1 || true
hubble_node1="unix://$(dirname "${TENDRIL_SOCK_NODE1#unix://}")/hubble.sock" # beside the API socket
for _ in $(seq 20); do # the drop reaches the node's flow ring within moments
	$T observe --server "$hubble_node1" --last 1 --verdict DROPPED --from-pod demo/other --to-pod demo/backend | grep -q . && break
	sleep 0.1
done
$T observe --server "$hubble_node1" --last 3 --verdict DROPPED --from-pod demo/other --to-pod demo/backend
echo "  the frontend's allowed connection, with the rule that allowed it:"
$T observe --server "$hubble_node1" --last 1 --type policy-verdict --from-pod demo/frontend --to-pod demo/backend

step "tendril status of node1"
$T $node1 status

step "The web UI (tendril ui over the relay): the service map, the flows, the policy view"
ui_port=${TENDRIL_UI%/}
ui_port=${ui_port##*:}
echo "  $TENDRIL_UI  -- open it in a browser (from another machine: ssh -L $ui_port:127.0.0.1:$ui_port this-machine)"
curl -s "${TENDRIL_UI}api/status" | sed 's/^/  its status: /'

step "Done. The lab stays up; try next:"
cat <<TRY
  eval "\$($T lab env)"                      # KUBECONFIG, kubectl alias, TENDRIL_SOCK (node1)
  kubectl get pods -A -o wide; kubectl get nodes
  $T lab status
  $T lab probe demo/far $backend:80 --udp    # exit 0 answered, 1 blocked, 2 could not probe
  $T lab probe demo/far backend:80           # by Service name, resolved by the cluster DNS from the pod
  $T lab exec demo/far -- getent hosts kubernetes.default
  $T lab exec demo/other -- ip route
  $T -H \$TENDRIL_SOCK_NODE2 endpoint list
  $T -H \$TENDRIL_SOCK_NODE2 ip list         # the ipcache: pods of both nodes with their identities
  $T observe --server $hubble_node1 --follow   # node1's flows as they happen (or: hubble observe --server ...)
  open $TENDRIL_UI                             # the web UI: service map (other -> backend in red), flows, policy
  $T connectivity test --keep                 # and look at namespace tendril-connectivity afterwards
  kubectl delete tnp -n demo allow-frontend; kubectl label pod -n demo other app=frontend --overwrite
  make demo-down                              # tendril lab down: removes everything
TRY
