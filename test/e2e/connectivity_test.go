package e2e_test

import (
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// TestPrivilegedConnectivityTest runs `tendril connectivity test` against
// the package's lab: every check passes and the table says so.
func TestPrivilegedConnectivityTest(t *testing.T) {
	labUp(t)
	out, err := exec.Command(tendrilBin, "connectivity", "test", "--lab", labName).CombinedOutput()
	t.Logf("tendril connectivity test:\n%s", out)
	if err != nil {
		t.Fatalf("connectivity test failed: %v", err)
	}
	m := regexp.MustCompile(`(\d+) checks: (\d+) passed, 0 failed`).FindStringSubmatch(string(out))
	if m == nil || m[1] != m[2] || m[1] != "59" {
		t.Fatalf("no all-passed summary in the output")
	}
	for _, want := range []string{"pod to pod, other node, TCP", "pod to host, other node", "other client denied, other node", "egress to TCP 80 denied", "connectivity restored",
		"ClusterIP, other node, UDP", "ClusterIP balances over both backends", "sessionAffinity ClientIP: one backend",
		"internalTrafficPolicy Local, node 2, UDP", "other client denied via the ClusterIP",
		"Service by DNS name, other node, UDP", "Service by FQDN, DNS over TCP", "kubernetes Service by name (TLS), other node",
		"ClusterIP by per-packet NAT, other node, TCP", "NodePort on the node's address, UDP, node 2", "NodePort by per-packet NAT, TCP", "Service by DNS name by per-packet NAT, UDP", "egress policy without DNS: the name fails",
		"pod to world leaves with node 1's address, TCP", "pod to world leaves with node 2's address, UDP", "pod to world, node 2, ICMP",
		"world to NodePort, externalTrafficPolicy Local, node 2, UDP: its own server", "world to NodePort, externalTrafficPolicy Cluster, node 1, TCP: local and remote servers", "world to a hostPort of the server on node 2, UDP",
		"world to a LoadBalancer address on-link (L2 announcement), TCP: both servers"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks check %q", want)
		}
	}
}
