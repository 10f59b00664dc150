package k8s

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/policy"
)

// benchPolicies are 200 NetworkPolicies over 20 namespaces, ten each, in
// five shapes: default deny ingress; ingress from an app on one port;
// ingress from an app in namespaces of a team (AND) on two ports; egress
// to kube-dns on 53 UDP and TCP; egress to an ipBlock with an except on a
// port range.
func benchPolicies() []*networkingv1.NetworkPolicy {
	proto := func(p corev1.Protocol) *corev1.Protocol { return &p }
	port := func(n int) *intstr.IntOrString { v := intstr.FromInt32(int32(n)); return &v }
	end := func(n int32) *int32 { return &n }
	app := func(i int) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app%d", i%50)}}
	}
	var out []*networkingv1.NetworkPolicy
	for i := 0; i < 200; i++ {
		ns := fmt.Sprintf("ns%d", i%20)
		np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d", i), Namespace: ns, UID: types.UID(fmt.Sprintf("uid-%d", i))}}
		switch i % 5 {
		case 0:
			np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
		case 1:
			np.Spec.PodSelector = *app(i)
			np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: app(i + 1)}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: port(8000 + i)}},
			}}
		case 2:
			np.Spec.PodSelector = *app(i)
			np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{
					NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": fmt.Sprintf("t%d", i%4)}},
					PodSelector:       app(i + 2),
				}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: port(80)}, {Port: port(443)}},
			}}
		case 3:
			np.Spec.PodSelector = *app(i)
			np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
			np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{
				To: []networkingv1.NetworkPolicyPeer{{
					NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: "kube-system"}},
					PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"k8s-app": "kube-dns"}},
				}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: proto(corev1.ProtocolUDP), Port: port(53)}, {Port: port(53)}},
			}}
		case 4:
			np.Spec.PodSelector = *app(i)
			np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
			np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{
				To:    []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{fmt.Sprintf("10.%d.0.0/16", i%256)}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: port(30000), EndPort: end(32767)}},
			}}
		}
		out = append(out, np)
	}
	return out
}

// benchUniverse is 5,000 pod identities (20 namespaces × 50 apps × 5
// tiers, namespaces in four teams), the reserved ones and the two CIDR
// identities of each of the policies' prefixes; and 1,000 of the pods as endpoints,
// every app of every namespace among them.
func benchUniverse(repo *policy.Repository) (policy.Universe, []policy.Endpoint) {
	u := policy.ReservedPeers()
	var eps []policy.Endpoint
	for i := 0; i < 5000; i++ {
		ns := fmt.Sprintf("ns%d", (i/50)%20)
		labels := EndpointLabels(ns, map[string]string{corev1.LabelMetadataName: ns, "team": fmt.Sprintf("t%d", (i/50)%4)},
			map[string]string{"app": fmt.Sprintf("app%d", i%50), "tier": fmt.Sprintf("t%d", i/1000)})
		u = append(u, policy.Peer{ID: identity.NumericIdentity(256 + i), Labels: labels})
		if i%5 == (i/5)%5 {
			eps = append(eps, policy.Endpoint{Labels: labels})
		}
	}
	for i, pf := range repo.CIDRPrefixes() {
		// As the agent: the prefix's CIDR identity and its in-cluster one.
		id := identity.LocalScope | identity.NumericIdentity(i+1)
		u = append(u, policy.Peer{ID: id, Labels: []string{"cidr:" + pf.String()}, CIDR: pf},
			policy.Peer{ID: id | identity.InClusterCIDR, Labels: []string{"cidr:" + pf.String()}, CIDR: pf})
	}
	return u, eps
}

// BenchmarkTranslate200 translates the 200 policies.
func BenchmarkTranslate200(b *testing.B) {
	nps := benchPolicies()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, np := range nps {
			if _, err := Translate(np); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkApply200 translates the 200 policies into an empty repository
// (what the agent does when its NetworkPolicy informer first syncs).
func BenchmarkApply200(b *testing.B) {
	nps := benchPolicies()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		repo := policy.NewRepository()
		for _, np := range nps {
			if _, err := Apply(repo, np); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkApplyAndResolve200 is the whole cost of 200 policies on a node:
// apply them, then resolve 1,000 endpoints over 5,000 identities through a
// fresh selector cache.
func BenchmarkApplyAndResolve200(b *testing.B) {
	nps := benchPolicies()
	entries := 0
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		repo := policy.NewRepository()
		for _, np := range nps {
			if _, err := Apply(repo, np); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		u, eps := benchUniverse(repo)
		b.StartTimer()
		cache := policy.NewSelectorCache()
		entries = 0
		for _, ep := range eps {
			entries += len(repo.ResolveCached(ep, u, 1, cache).MapState)
		}
	}
	b.ReportMetric(float64(entries), "entries")
}

// BenchmarkUpdateOne200 replaces one of the 200 policies and re-resolves
// the endpoints of its namespace (the selector cache is rebuilt, as every
// repository revision does today).
func BenchmarkUpdateOne200(b *testing.B) {
	nps := benchPolicies()
	repo := policy.NewRepository()
	for _, np := range nps {
		if _, err := Apply(repo, np); err != nil {
			b.Fatal(err)
		}
	}
	u, eps := benchUniverse(repo)
	var inNS []policy.Endpoint
	for _, ep := range eps {
		for _, l := range ep.Labels {
			if l == policy.NamespaceLabel+"=ns1" {
				inNS = append(inNS, ep)
			}
		}
	}
	cache := policy.NewSelectorCache()
	changed := nps[1].DeepCopy()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		changed.Spec.Ingress[0].Ports[0].Port = func() *intstr.IntOrString { v := intstr.FromInt32(int32(9000 + i%1000)); return &v }()
		if _, err := Apply(repo, changed); err != nil {
			b.Fatal(err)
		}
		for _, ep := range inNS {
			repo.ResolveCached(ep, u, 1, cache)
		}
	}
	b.ReportMetric(float64(len(inNS)), "endpoints")
}
