package e2e_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/tendril-net/tendril/pkg/testutil/netpolmatrix"
)

// TestPrivilegedLabReachabilityMatrix applies Kubernetes NetworkPolicies
// one after another and compares the measured 9 × 9 reachability (real
// TCP through both nodes' datapaths) with the expected one after each
// (pkg/testutil/netpolmatrix, which test/e2e/containerd runs on real
// nodes too).
func TestPrivilegedLabReachabilityMatrix(t *testing.T) {
	reachabilityMatrix(t, labUp(t), labName)
}

// matrixLab is the matrix's view of a lab of this package (e its env):
// its pods are the lab kubelet's, spread over node1 and node2.
func matrixLab(e *env, name string) netpolmatrix.Lab {
	return netpolmatrix.Lab{Name: name, Tendril: tendrilBin, Clientset: e.cs, Nodes: []string{"node1", "node2"},
		Pod: func(ns, pod, node string, labels map[string]string) *corev1.Pod { return labPod(ns, pod, node, labels) }}
}

// reachabilityMatrix is the matrix on lab (e its env) over IPv4: the pods
// created in namespaces e2ex, e2ey, e2ez, the policies applied one after
// another. TestPrivilegedLabWireGuard and the routed lab run it too.
func reachabilityMatrix(t *testing.T, e *env, name string) {
	netpolmatrix.Run(t, matrixLab(e, name))
}
