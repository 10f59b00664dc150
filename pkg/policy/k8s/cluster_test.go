package k8s

import (
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/policy"
)

// cluster is the model of the upstream e2e netpol suite on top of the
// real engine: namespaces x, y, z (labelled ns=<name> and, as the API
// server does, kubernetes.io/metadata.name=<name>), pods a, b, c in each
// (labelled pod=<name>) serving ports 80 and 81 over TCP, UDP and SCTP
// under the names serve-<port>-<protocol>. Identities come from the real
// allocator over EndpointLabels, rules from Apply into a real repository;
// the ipcache is modelled as the agent's: a pod address is its pod's
// identity, another address the longest CIDR identity the rules created,
// else world; and, as the datapath does, a pod's address inside a prefix
// a rule names also carries that prefix's in-cluster identity.
type cluster struct {
	t          *testing.T
	repo       *policy.Repository
	alloc      *identity.LocalAllocator
	namespaces map[string]*corev1.Namespace
	pods       []*corev1.Pod
}

func newCluster(t *testing.T) *cluster {
	c := &cluster{t: t, repo: policy.NewRepository(), alloc: identity.NewLocalAllocator(), namespaces: map[string]*corev1.Namespace{}}
	for i, ns := range []string{"x", "y", "z"} {
		c.addNamespace(ns, map[string]string{"ns": ns})
		for j, name := range []string{"a", "b", "c"} {
			c.addPod(ns, name, map[string]string{"pod": name}, fmt.Sprintf("10.244.%d.%d", i+1, j+10), servePorts())
		}
	}
	return c
}

// servePorts are the upstream suite's container ports.
func servePorts() []corev1.ContainerPort {
	var out []corev1.ContainerPort
	for _, proto := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP} {
		for _, port := range []int32{80, 81} {
			out = append(out, corev1.ContainerPort{Name: fmt.Sprintf("serve-%d-%s", port, strings.ToLower(string(proto))), ContainerPort: port, Protocol: proto})
		}
	}
	return out
}

func (c *cluster) addNamespace(name string, labels map[string]string) {
	l := map[string]string{corev1.LabelMetadataName: name}
	for k, v := range labels {
		l[k] = v
	}
	c.namespaces[name] = &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}}
}

func (c *cluster) addPod(ns, name string, labels map[string]string, ip string, ports []corev1.ContainerPort) {
	c.pods = append(c.pods, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "server", Ports: ports}}},
		Status:     corev1.PodStatus{PodIP: ip},
	})
}

func (c *cluster) pod(key string) *corev1.Pod {
	for _, p := range c.pods {
		if p.Namespace+"/"+p.Name == key {
			return p
		}
	}
	c.t.Fatalf("no pod %s", key)
	return nil
}

// labelPod and labelNamespace change labels, as the upstream "updated pod"
// and "updated namespace" cases do: the identities follow.
func (c *cluster) labelPod(key, k, v string) { c.pod(key).Labels[k] = v }

func (c *cluster) labelNamespace(ns, k, v string) { c.namespaces[ns].Labels[k] = v }

// apply puts NetworkPolicies (YAML documents) into the repository.
func (c *cluster) apply(docs ...string) {
	c.t.Helper()
	for _, doc := range docs {
		if _, err := Apply(c.repo, mustPolicy(c.t, doc)); err != nil {
			c.t.Fatalf("apply: %v", err)
		}
	}
}

func mustPolicy(t *testing.T, doc string) *networkingv1.NetworkPolicy {
	t.Helper()
	var np networkingv1.NetworkPolicy
	if err := yaml.UnmarshalStrict([]byte(doc), &np); err != nil {
		t.Fatalf("policy document: %v\n%s", err, doc)
	}
	if np.UID == "" {
		np.UID = types.UID("uid-" + np.Namespace + "-" + np.Name)
	}
	return &np
}

// snapshot is the cluster's identities and resolved policies at one
// moment: what the agent realizes in the datapath.
type snapshot struct {
	c        *cluster
	universe policy.Universe
	ids      map[string]identity.NumericIdentity // pod key → identity
	results  map[string]policy.Result            // pod key → its policy
	cidrs    []policy.Peer
}

func (c *cluster) snapshot() *snapshot {
	c.t.Helper()
	s := &snapshot{c: c, universe: policy.ReservedPeers(), ids: map[string]identity.NumericIdentity{}, results: map[string]policy.Result{}}
	endpoints := map[string]policy.Endpoint{}
	seen := map[identity.NumericIdentity]bool{}
	for _, p := range c.pods {
		key := p.Namespace + "/" + p.Name
		ep := EndpointForPod(p, c.namespaces[p.Namespace])
		id, _, err := c.alloc.Allocate(ep.Labels)
		if err != nil {
			c.t.Fatal(err)
		}
		s.ids[key], endpoints[key] = id.ID, ep
		if !seen[id.ID] {
			seen[id.ID] = true
			s.universe = append(s.universe, policy.Peer{ID: id.ID, Labels: id.Labels, NamedPorts: ep.NamedPorts})
		}
	}
	// The agent gives every prefix the rules name a node-local identity,
	// and an in-cluster one that pods' addresses inside it carry.
	for i, pf := range c.repo.CIDRPrefixes() {
		p := policy.Peer{ID: identity.LocalScope | identity.NumericIdentity(i+1), Labels: []string{"cidr:" + pf.String()}, CIDR: pf}
		s.cidrs = append(s.cidrs, p)
		s.universe = append(s.universe, p, policy.Peer{ID: p.ID | identity.InClusterCIDR, Labels: p.Labels, CIDR: pf})
	}
	cache := policy.NewSelectorCache()
	for key, ep := range endpoints {
		res := c.repo.ResolveCached(ep, s.universe, 1, cache)
		// The selector-cache path (the agent's) and the plain one agree.
		if plain := c.repo.Resolve(ep, s.universe); !reflect.DeepEqual(plain.MapState, res.MapState) ||
			plain.EnforceIngress != res.EnforceIngress || plain.EnforceEgress != res.EnforceEgress {
			c.t.Fatalf("%s: cached resolution %v differs from plain %v", key, res.MapState, plain.MapState)
		}
		s.results[key] = res
	}
	return s
}

// peerOf is what the datapath knows of an endpoint name: a pod ("x/a"),
// "host", "remote-node", or an address. A pod address keeps its pod's
// identity whatever CIDR names it (the ipcache prefers endpoint entries);
// cidrID is then the in-cluster identity of the longest prefix a rule
// names holding the address (the policy CIDR map), 0 when none does.
// Another address gets the longest CIDR identity the rules created, else
// world.
func (s *snapshot) peerOf(name string) (id, cidrID identity.NumericIdentity) {
	if key, ok := s.ids[name]; ok {
		for _, p := range s.c.pods {
			if p.Namespace+"/"+p.Name == name {
				return key, s.inClusterCIDR(netip.MustParseAddr(p.Status.PodIP))
			}
		}
	}
	if id, ok := identity.ReservedByName(name); ok {
		return id, 0
	}
	addr, err := netip.ParseAddr(name)
	if err != nil {
		s.c.t.Fatalf("endpoint %q: not a pod, reserved identity or address", name)
	}
	for _, p := range s.c.pods {
		if p.Status.PodIP == name {
			return s.ids[p.Namespace+"/"+p.Name], s.inClusterCIDR(addr)
		}
	}
	best, bestBits := identity.World, -1
	for _, p := range s.cidrs {
		if p.CIDR.Contains(addr) && p.CIDR.Bits() > bestBits {
			best, bestBits = p.ID, p.CIDR.Bits()
		}
	}
	return best, 0
}

// inClusterCIDR is the in-cluster identity of the longest prefix a rule
// names holding addr, 0 when none does.
func (s *snapshot) inClusterCIDR(addr netip.Addr) identity.NumericIdentity {
	var best identity.NumericIdentity
	bestBits := -1
	for _, p := range s.cidrs {
		if p.CIDR.Contains(addr) && p.CIDR.Bits() > bestBits {
			best, bestBits = p.ID|identity.InClusterCIDR, p.CIDR.Bits()
		}
	}
	return best
}

// allowed reports whether src may send dst a packet: src's egress policy
// when src is a pod, dst's ingress policy when dst is a pod, each enforced
// only where a rule selects the pod in that direction.
func (s *snapshot) allowed(src, dst string, proto uint8, port uint16) bool {
	srcID, srcCIDR := s.peerOf(src)
	dstID, dstCIDR := s.peerOf(dst)
	if res, ok := s.results[src]; ok && res.EnforceEgress {
		if ok, _ := res.MapState.AllowedWithCIDR(policy.Egress, dstID, dstCIDR, proto, port); !ok {
			return false
		}
	}
	if res, ok := s.results[dst]; ok && res.EnforceIngress {
		if ok, _ := res.MapState.AllowedWithCIDR(policy.Ingress, srcID, srcCIDR, proto, port); !ok {
			return false
		}
	}
	return true
}

// expect is one line of an expected reachability matrix: every pair
// matching (from, to) is allowed or not. Patterns: "*" any pod, "x/*" the
// pods of a namespace, "*/a" pods named a, "x/a" one pod. Lines apply in
// order over a matrix where everything is allowed, as the upstream suite's
// Reachability does.
type expect struct {
	from, to string
	allow    bool
}

// probe is one flow to or from something that is not a pod (an address,
// "host", "remote-node"), or a single pod pair.
type probe struct {
	from, to string
	allow    bool
}

// check is the reachability at one protocol and port.
type check struct {
	proto  corev1.Protocol
	port   uint16
	expect []expect
	probes []probe
}

func matchPod(pattern, key string) bool {
	if pattern == "*" {
		return true
	}
	pns, pname, _ := strings.Cut(pattern, "/")
	ns, name, _ := strings.Cut(key, "/")
	return (pns == "*" || pns == ns) && (pname == "*" || pname == name)
}

// verify compares the full pod × pod matrix and the probes with the
// expectation and prints both matrices when they differ. A pod's traffic
// to itself is not compared (as upstream: loopback is not policy's).
func (s *snapshot) verify(t *testing.T, label string, ck check) {
	t.Helper()
	proto, ok := protocolNumber(ck.proto)
	if !ok {
		t.Fatalf("protocol %q", ck.proto)
	}
	keys := make([]string, 0, len(s.c.pods))
	for _, p := range s.c.pods {
		keys = append(keys, p.Namespace+"/"+p.Name)
	}
	want := map[[2]string]bool{}
	for _, from := range keys {
		for _, to := range keys {
			allow := true
			for _, e := range ck.expect {
				if matchPod(e.from, from) && matchPod(e.to, to) {
					allow = e.allow
				}
			}
			want[[2]string{from, to}] = allow
		}
	}
	var wrong []string
	got := map[[2]string]bool{}
	for _, from := range keys {
		for _, to := range keys {
			if from == to {
				continue
			}
			pair := [2]string{from, to}
			got[pair] = s.allowed(from, to, proto, ck.port)
			if got[pair] != want[pair] {
				wrong = append(wrong, fmt.Sprintf("%s → %s: %s, want %s", from, to, word(got[pair]), word(want[pair])))
			}
		}
	}
	for _, p := range ck.probes {
		if g := s.allowed(p.from, p.to, proto, ck.port); g != p.allow {
			wrong = append(wrong, fmt.Sprintf("%s → %s: %s, want %s", p.from, p.to, word(g), word(p.allow)))
		}
	}
	if len(wrong) == 0 {
		return
	}
	t.Errorf("%s %s/%d: %d wrong:\n  %s\nexpected (rows from, columns to; . allowed, X denied):\n%s\nactual (! marks a wrong cell):\n%s",
		label, ck.proto, ck.port, len(wrong), strings.Join(wrong, "\n  "), matrix(keys, want, nil), matrix(keys, got, want))
}

func word(allowed bool) string {
	if allowed {
		return "allowed"
	}
	return "denied"
}

// matrix prints a reachability matrix; with want, cells that differ from
// it are marked.
func matrix(keys []string, m, want map[[2]string]bool) string {
	width := 4
	for _, k := range keys {
		width = max(width, len(k)+1)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%*s", width, "")
	for _, k := range keys {
		fmt.Fprintf(&b, "%*s", width, k)
	}
	b.WriteByte('\n')
	for _, from := range keys {
		fmt.Fprintf(&b, "%*s", width, from)
		for _, to := range keys {
			cell := "-"
			if from != to {
				pair := [2]string{from, to}
				cell = "X"
				if m[pair] {
					cell = "."
				}
				if want != nil && m[pair] != want[pair] {
					cell += "!"
				}
			}
			fmt.Fprintf(&b, "%*s", width, cell)
		}
		b.WriteByte('\n')
	}
	return b.String()
}
