#!/usr/bin/env bash
# The demo's policy step on its own (hack/demo.sh runs it): against a lab
# running examples/lab/demo-app.yaml, applies examples/lab/allow-frontend.yaml
# (the backend accepts only the frontend, on 80/TCP), then probes the backend
# from each demo pod and compares every outcome with what the policy says:
# exit 1 on a mismatch. TENDRIL_DEMO_DELETE_POLICY=1 deletes the policy again
# right before the probes, so they must mismatch and the run must fail (a test
# does that: test/e2e TestPrivilegedDemoPolicyProbes). TENDRIL is the tendril
# binary (default bin/tendril), TENDRIL_LAB the lab (default tdrlab).
set -euo pipefail
cd "$(dirname "$0")/.."
T=${TENDRIL:-bin/tendril}
export TENDRIL_LAB=${TENDRIL_LAB:-tdrlab}
KUBECTL=$(hack/k8s-binaries.sh --print-dir)/kubectl-v1.36.3
eval "$($T lab env)"
k() { "$KUBECTL" "$@"; }
# shellcheck source=hack/demo-lib.sh
. hack/demo-lib.sh
backend=$(k get pod -n demo backend -o jsonpath='{.status.podIP}')
cip=$(k get service -n demo backend -o jsonpath='{.spec.clusterIP}')

k apply -f examples/lab/allow-frontend.yaml
for _ in $(seq 50); do # until node1's agent enforces it
	$T lab probe demo/other "$backend:80" --timeout 200ms >/dev/null 2>&1 || break
	sleep 0.1
done
k get tnp -n demo
if [[ ${TENDRIL_DEMO_DELETE_POLICY:-} == 1 ]]; then
	echo "  TENDRIL_DEMO_DELETE_POLICY=1: deleting the policy before the probes (they must mismatch)"
	k delete -f examples/lab/allow-frontend.yaml
	for _ in $(seq 50); do # until node1's agent no longer enforces it
		$T lab probe demo/other "$backend:80" --timeout 200ms >/dev/null 2>&1 && break
		sleep 0.1
	done
fi
probe frontend 80 connected
probe other 80 blocked
probe frontend 53 blocked --udp
svcprobe frontend connected
svcprobe far blocked 1
demo_verdict
