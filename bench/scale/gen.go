package main

import (
	"fmt"
	"net/netip"
	"sort"

	"github.com/tendril-net/tendril/pkg/identity"
)

// cluster is the simulated cluster: which pods, nodes, identities,
// services and policies exist, computed from the sizes alone so every
// part of the harness (the fill, the checks, the churn) agrees on them.
//
// Layout:
//   - remote node i is "sim-NNNN", pod CIDR 10.(65+i/256).(i%256).0/24,
//     address 172.20.(i/250).(i%250+1);
//   - pod j lives on node j%nodes at host number 1+j/nodes of its CIDR;
//   - pods come in groups of three of one app: app (j/3)%apps, version
//     v1 or v2 ((j/(3*apps))%2), so each identity (app, version) has
//     pods on many nodes;
//   - app a lives in namespace a%namespaces, its role is client, server
//     or db (a%3);
//   - policy p selects app p%apps; even p is a Kubernetes NetworkPolicy,
//     odd p a TendrilNetworkPolicy; both allow TCP 8080 from every
//     client in any namespace and TCP 9090 from app (a+1)%apps.
type cluster struct {
	nodes, pods, apps, namespaces, services, policies int
}

const (
	// firstIdentity is the number of identity 0 of the label sets; new
	// identities (measured pods) start at newIdentityBase.
	firstIdentity   = 10000
	newIdentityBase = 40000
	clientPort      = 8080
	peerPort        = 9090
)

var roles = []string{"client", "server", "db"}

func (c cluster) validate() error {
	switch {
	case c.nodes < 1 || c.nodes > 4096:
		return fmt.Errorf("-nodes %d: 1 to 4096", c.nodes)
	case c.pods < 0 || c.pods > c.nodes*200:
		return fmt.Errorf("-pods %d: at most 200 per node (%d)", c.pods, c.nodes*200)
	case c.apps < 3 || c.namespaces < 1 || c.namespaces > c.apps:
		return fmt.Errorf("-apps %d, -namespaces %d: at least 3 apps, 1 to apps namespaces", c.apps, c.namespaces)
	case 2*c.apps > newIdentityBase-firstIdentity:
		return fmt.Errorf("-apps %d: too many", c.apps)
	}
	return nil
}

func nodeName(i int) string { return fmt.Sprintf("sim-%04d", i) }

// podCIDR is remote node i's pod CIDR.
func podCIDR(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(65 + i/256), byte(i % 256), 0}), 24)
}

// nodeIP is remote node i's InternalIP.
func nodeIP(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{172, 20, byte(i / 250), byte(i%250 + 1)})
}

func (c cluster) slotsPerNode() int { return (c.pods + c.nodes - 1) / c.nodes }

// podAt is the address of host number host on node i.
func podAt(i, host int) netip.Addr {
	a := podCIDR(i).Addr().As4()
	a[3] = byte(host)
	return netip.AddrFrom4(a)
}

// podNode and podIP place pod j.
func (c cluster) podNode(j int) int      { return j % c.nodes }
func (c cluster) podIP(j int) netip.Addr { return podAt(j%c.nodes, 1+j/c.nodes) }
func (c cluster) podApp(j int) int       { return (j / 3) % c.apps }
func (c cluster) podVersion(j int) int   { return (j / (3 * c.apps)) % 2 }

// podIdentity is pod j's identity number.
func (c cluster) podIdentity(j int) identity.NumericIdentity {
	return c.identity(c.podApp(j), c.podVersion(j))
}

func (c cluster) identity(app, version int) identity.NumericIdentity {
	return identity.NumericIdentity(firstIdentity + 2*app + version)
}

func (c cluster) identities() int { return 2 * c.apps }

func appName(a int) string           { return fmt.Sprintf("app-%03d", a) }
func (c cluster) appNS(a int) string { return fmt.Sprintf("ns-%02d", a%c.namespaces) }
func role(a int) string              { return roles[a%3] }

// labelsOf is the identity label set of app a's pods of the given
// version, as an agent derives it from the pod and its namespace (sorted).
func (c cluster) labelsOf(app int, version string) []string {
	ns := c.appNS(app)
	l := []string{
		"k8s:app=" + appName(app),
		"k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name=" + ns,
		"k8s:io.cilium.k8s.policy.serviceaccount=" + appName(app),
		"k8s:io.kubernetes.pod.namespace=" + ns,
		"k8s:role=" + role(app),
		"k8s:version=" + version,
	}
	sort.Strings(l)
	return l
}

func versionName(v int) string { return fmt.Sprintf("v%d", v+1) }

// identityLabels is identity n's label set (n in the label sets' range).
func (c cluster) identityLabels(n int) []string {
	return c.labelsOf(n/2, versionName(n%2))
}

// allowed are the identities whose traffic to port a local endpoint of app
// a must allow: every client's on clientPort, app (a+1)'s on peerPort.
func (c cluster) allowed(a int) map[identity.NumericIdentity]uint16 {
	out := map[identity.NumericIdentity]uint16{}
	for b := 0; b < c.apps; b++ {
		if role(b) == "client" {
			out[c.identity(b, 0)], out[c.identity(b, 1)] = clientPort, clientPort
		}
	}
	b := (a + 1) % c.apps
	if role(b) != "client" {
		out[c.identity(b, 0)], out[c.identity(b, 1)] = peerPort, peerPort
	}
	return out
}

// newPod is the k-th pod made after the fill (measured or churned): its
// address follows the filled ones, node by node.
func (c cluster) newPod(k int) (node int, ip netip.Addr) {
	node = k % c.nodes
	host := 1 + c.slotsPerNode() + (k/c.nodes)%(253-c.slotsPerNode())
	return node, podAt(node, host)
}

// newClientLabels is the label set of the k-th new identity: a client of
// app 0's namespace with a label of its own, so every local endpoint's
// client rule selects it.
func (c cluster) newClientLabels(k int) []string {
	l := append(c.labelsOf(0, "new"), fmt.Sprintf("k8s:instance=n%d", k))
	sort.Strings(l)
	return l
}

// serviceApp is the app service s selects; servicePods its endpoints'
// pods (up to 10).
func (c cluster) serviceApp(s int) int { return s % c.apps }

func (c cluster) servicePods(s int) []int {
	a := c.serviceApp(s)
	var out []int
	for k := 0; len(out) < 10; k++ {
		base := 3 * (a + c.apps*k)
		if base >= c.pods {
			break
		}
		for r := 0; r < 3 && len(out) < 10 && base+r < c.pods; r++ {
			out = append(out, base+r)
		}
	}
	return out
}
