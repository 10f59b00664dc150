package main

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/policy"
)

var full = cluster{nodes: 1000, pods: 50000, apps: 500, namespaces: 50, services: 2000, policies: 500}

// Every pod's address is unique and inside its own node's pod CIDR (the
// agent refuses a claim outside the CIDR of the node it names), and no
// node address falls in any pod CIDR.
func TestPodAddressesInTheirNodesCIDR(t *testing.T) {
	for _, c := range []cluster{full, {nodes: 100, pods: 5000, apps: 50, namespaces: 10}, {nodes: 7, pods: 1000, apps: 3, namespaces: 1}} {
		if err := c.validate(); err != nil {
			t.Fatal(err)
		}
		seen := map[netip.Addr]int{}
		for j := 0; j < c.pods; j++ {
			ip := c.podIP(j)
			if !podCIDR(c.podNode(j)).Contains(ip) {
				t.Fatalf("pod %d: %s outside node %d's %s", j, ip, c.podNode(j), podCIDR(c.podNode(j)))
			}
			if a := ip.As4(); a[3] == 0 || a[3] == 255 {
				t.Fatalf("pod %d: %s is a network or broadcast address", j, ip)
			}
			if k, dup := seen[ip]; dup {
				t.Fatalf("pods %d and %d share %s", k, j, ip)
			}
			seen[ip] = j
		}
		// New pods (measured, churned) take other addresses of their
		// node's CIDR.
		for k := 0; k < 3*c.nodes; k++ {
			node, ip := c.newPod(k)
			if !podCIDR(node).Contains(ip) {
				t.Fatalf("new pod %d: %s outside %s", k, ip, podCIDR(node))
			}
			if j, dup := seen[ip]; dup {
				t.Fatalf("new pod %d takes pod %d's %s", k, j, ip)
			}
		}
		nodeIPs := map[netip.Addr]bool{}
		for i := 0; i < c.nodes; i++ {
			if nodeIPs[nodeIP(i)] {
				t.Fatalf("node %d: address %s taken", i, nodeIP(i))
			}
			nodeIPs[nodeIP(i)] = true
			for k := 0; k < c.nodes; k += max(1, c.nodes/17) {
				if podCIDR(k).Contains(nodeIP(i)) {
					t.Fatalf("node %d's address %s in node %d's pod CIDR", i, nodeIP(i), k)
				}
			}
		}
	}
}

// The label sets are valid identity labels, distinct, spread over the
// namespaces, and every identity has pods.
func TestIdentityLabelSets(t *testing.T) {
	c := full
	keys := map[string]int{}
	namespaces := map[string]bool{}
	for n := 0; n < c.identities(); n++ {
		l := c.identityLabels(n)
		if err := identity.CheckLabels(l); err != nil {
			t.Fatalf("identity %d: %v", n, err)
		}
		k := identity.LabelsKey(l)
		if m, dup := keys[k]; dup {
			t.Fatalf("identities %d and %d share labels %s", m, n, k)
		}
		keys[k] = n
		if got := c.identity(n/2, n%2); int(got) != firstIdentity+n {
			t.Fatalf("identity %d numbered %d", n, got)
		}
		for _, x := range l {
			if v, ok := strings.CutPrefix(x, "k8s:io.kubernetes.pod.namespace="); ok {
				namespaces[v] = true
			}
		}
	}
	if len(namespaces) != c.namespaces {
		t.Fatalf("%d namespaces in the label sets, want %d", len(namespaces), c.namespaces)
	}
	pods := map[identity.NumericIdentity]int{}
	for j := 0; j < c.pods; j++ {
		pods[c.podIdentity(j)]++
	}
	if len(pods) != c.identities() {
		t.Fatalf("%d identities have pods, want %d", len(pods), c.identities())
	}
	if err := identity.CheckLabels(c.newClientLabels(7)); err != nil {
		t.Fatal(err)
	}
}

// allowed is what the policies select: checked against the selectors
// themselves, evaluated by the policy package on every identity's labels.
func TestAllowedMatchesTheRules(t *testing.T) {
	c := cluster{nodes: 10, pods: 300, apps: 12, namespaces: 4, policies: 12}
	all := map[identity.NumericIdentity][]string{}
	for n := 0; n < c.identities(); n++ {
		all[identity.NumericIdentity(firstIdentity+n)] = c.identityLabels(n)
	}
	for a := 0; a < c.apps; a++ {
		r := c.tendrilRule(a) // policy a selects app a
		want := c.allowed(a)
		for id, l := range all {
			client := policy.Matches(&r.Ingress[0].FromEndpoints[0], l)
			peer := policy.Matches(&r.Ingress[1].FromEndpoints[0], l)
			port, ok := want[id]
			switch {
			case client && (!ok || port != clientPort):
				t.Errorf("app %d: %d (%v) is a client but allowed says %d, %v", a, id, l, port, ok)
			case !client && peer && (!ok || port != peerPort):
				t.Errorf("app %d: %d (%v) is the peer app but allowed says %d, %v", a, id, l, port, ok)
			case !client && !peer && ok:
				t.Errorf("app %d: %d (%v) selected by no rule but allowed", a, id, l)
			}
		}
		// The new pods' identities are clients.
		if !policy.Matches(&r.Ingress[0].FromEndpoints[0], c.newClientLabels(3)) {
			t.Errorf("app %d: the client rule does not select a new pod", a)
		}
	}
	// The NetworkPolicy says the same in its own schema.
	np := c.networkPolicy(4)
	if np.Spec.PodSelector.MatchLabels["app"] != appName(4) || np.Spec.Ingress[1].From[0].PodSelector.MatchLabels["app"] != appName(5) {
		t.Fatalf("network policy 4: %+v", np.Spec)
	}
}

// Every service's endpoints are pods of the app it selects.
func TestServicePods(t *testing.T) {
	c := full
	for s := 0; s < c.services; s += 37 {
		ps := c.servicePods(s)
		if len(ps) != 10 {
			t.Fatalf("service %d: %d endpoints", s, len(ps))
		}
		for _, j := range ps {
			if c.podApp(j) != c.serviceApp(s) || j >= c.pods {
				t.Fatalf("service %d (app %d): pod %d of app %d", s, c.serviceApp(s), j, c.podApp(j))
			}
		}
	}
}
