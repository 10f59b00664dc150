package observed

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/policy"
	"github.com/tendril-net/tendril/pkg/policy/api"
	policyk8s "github.com/tendril-net/tendril/pkg/policy/k8s"
)

// pod is a pod of the test cluster: namespace, name, labels, address and
// identity.
type pod struct {
	ns, name string
	labels   map[string]string
	ip       string
	id       uint32
}

func (p pod) endpoint() *flowpb.Endpoint {
	return &flowpb.Endpoint{Identity: p.id, Namespace: p.ns, PodName: p.name,
		Labels: policyk8s.EndpointLabels(p.ns, map[string]string{"kubernetes.io/metadata.name": p.ns}, p.labels)}
}

var (
	web1 = pod{"shop", "web-5d8f-a", map[string]string{"app": "web", "pod-template-hash": "5d8f"}, "10.244.1.10", 1000}
	web2 = pod{"shop", "web-5d8f-b", map[string]string{"app": "web", "pod-template-hash": "5d8f"}, "10.244.2.10", 1000}
	db   = pod{"shop", "db-0", map[string]string{"app": "db"}, "10.244.1.20", 1001}
	dns  = pod{"kube-system", "coredns-x", map[string]string{"k8s-app": "kube-dns"}, "10.244.2.53", 1002}
	mon  = pod{"monitoring", "prom-0", map[string]string{"app": "prom"}, "10.244.2.30", 1003}
)

var t0 = time.Date(2026, 11, 24, 5, 0, 0, 0, time.UTC)

func tcpFlow(i int, src, dst *flowpb.Endpoint, sip, dip string, port uint32, v flowpb.Verdict, reply bool) *flowpb.Flow {
	return &flowpb.Flow{Time: timestamppb.New(t0.Add(time.Duration(i) * time.Second)), Verdict: v,
		IP: &flowpb.IP{Source: sip, Destination: dip}, Source: src, Destination: dst, IsReply: wrapperspb.Bool(reply),
		L4: &flowpb.Layer4{Protocol: &flowpb.Layer4_TCP{TCP: &flowpb.TCP{SourcePort: 40000 + uint32(i), DestinationPort: port}}}}
}

func udpFlow(i int, src, dst pod, port uint32) *flowpb.Flow {
	return &flowpb.Flow{Time: timestamppb.New(t0.Add(time.Duration(i) * time.Second)), Verdict: flowpb.Verdict_FORWARDED,
		IP: &flowpb.IP{Source: src.ip, Destination: dst.ip}, Source: src.endpoint(), Destination: dst.endpoint(), IsReply: wrapperspb.Bool(false),
		L4: &flowpb.Layer4{Protocol: &flowpb.Layer4_UDP{UDP: &flowpb.UDP{SourcePort: 50000, DestinationPort: port}}}}
}

func world(ip string) *flowpb.Endpoint {
	return &flowpb.Endpoint{Identity: uint32(identity.World), Labels: []string{"reserved:world"}}
}

// observedFlows: web → db:5432 (from both web pods, seen at both ends),
// web → DNS, monitoring → web:9090, web → a world API on 443, a reply, a
// dropped attempt db → world:25.
func observedFlows() []*flowpb.Flow {
	fw := flowpb.Verdict_FORWARDED
	return []*flowpb.Flow{
		tcpFlow(1, web1.endpoint(), db.endpoint(), web1.ip, db.ip, 5432, fw, false),
		tcpFlow(2, web1.endpoint(), db.endpoint(), web1.ip, db.ip, 5432, fw, false), // the other end's event
		tcpFlow(3, db.endpoint(), web1.endpoint(), db.ip, web1.ip, 40001, fw, true), // the reply
		tcpFlow(4, web2.endpoint(), db.endpoint(), web2.ip, db.ip, 5432, fw, false),
		udpFlow(5, web1, dns, 53),
		tcpFlow(6, mon.endpoint(), web2.endpoint(), mon.ip, web2.ip, 9090, fw, false),
		tcpFlow(7, web1.endpoint(), world("203.0.113.7"), web1.ip, "203.0.113.7", 443, fw, false),
		tcpFlow(8, db.endpoint(), world("198.51.100.1"), db.ip, "198.51.100.1", 25, flowpb.Verdict_DROPPED, false),
	}
}

func TestConnections(t *testing.T) {
	conns := Connections(observedFlows())
	var got []string
	for _, c := range conns {
		got = append(got, fmt.Sprintf("%s -> %s %s/%d %s x%d", c.Src.Workload(), c.Dst.Workload(), protoName(c.Proto), c.Port, c.Verdict, c.Flows))
	}
	want := []string{
		"monitoring/app=prom -> shop/app=web TCP/9090 FORWARDED x1",
		"shop/app=db -> world:198.51.100.1 TCP/25 DROPPED x1",
		"shop/app=web -> kube-system/k8s-app=kube-dns UDP/53 FORWARDED x1",
		"shop/app=web -> shop/app=db TCP/5432 FORWARDED x2",
		"shop/app=web -> shop/app=db TCP/5432 FORWARDED x1",
		"shop/app=web -> world:203.0.113.7 TCP/443 FORWARDED x1",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("connections:\n%q\nwant\n%q", got, want)
	}
}

// The suggested policies, applied to the real engine, admit every observed
// connection and deny one that was never observed.
func TestSuggestAdmitsExactlyTheObserved(t *testing.T) {
	conns := Connections(observedFlows())
	sugg, err := Suggest(conns, SuggestOptions{Namespace: "shop"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	repo := policy.NewRepository()
	for _, s := range sugg {
		names = append(names, s.Policy.Name)
		// Through YAML, as a user applies it.
		b, err := yaml.Marshal(s.Policy)
		if err != nil {
			t.Fatal(err)
		}
		var np networkingv1.NetworkPolicy
		if err := yaml.Unmarshal(b, &np); err != nil {
			t.Fatal(err)
		}
		if _, err := policyk8s.Apply(repo, &np); err != nil {
			t.Fatalf("%s: %v\n%s", np.Name, err, b)
		}
	}
	if !slices.Equal(names, []string{"suggested-db", "suggested-web"}) {
		t.Fatalf("policies %v", names)
	}
	for _, s := range sugg {
		if s.Policy.Name == "suggested-web" {
			if got := s.Policy.Spec.PodSelector.MatchLabels; len(got) != 1 || got["app"] != "web" {
				t.Fatalf("web's selector %v: want app=web without the per-pod hash", got)
			}
		}
	}
	ev := NewEvaluator(repo, conns)
	for _, c := range conns {
		want := c.Verdict != flowpb.Verdict_DROPPED
		if got := ev.Allowed(c); got != want {
			t.Errorf("%s -> %s %d: allowed = %v, want %v", c.Src.Workload(), c.Dst.Workload(), c.Port, got, want)
		}
	}
	// Never observed: db → web, web → db on another port, web → another
	// world address, monitoring → db.
	never := []Connection{
		{Src: peerOf(db), Dst: peerOf(web1), Proto: 6, Port: 8080},
		{Src: peerOf(web1), Dst: peerOf(db), Proto: 6, Port: 5433},
		{Src: peerOf(web2), Dst: Peer{Kind: PeerWorld, Identity: identity.World, IP: netip.MustParseAddr("203.0.113.8")}, Proto: 6, Port: 443},
		{Src: peerOf(mon), Dst: peerOf(db), Proto: 6, Port: 5432},
	}
	ev = NewEvaluator(repo, append(conns, never...))
	for _, c := range never {
		if ev.Allowed(c) {
			t.Errorf("never observed %s -> %s %d: allowed", c.Src.Workload(), c.Dst.Workload(), c.Port)
		}
	}
}

func peerOf(p pod) Peer {
	pe, _ := peer(p.endpoint(), p.ip)
	return pe
}

// What-if: a default-deny ingress policy in shop changes exactly the
// connections into shop that nothing else admits; a candidate replacing
// the current version of an object replaces it.
func TestWhatIf(t *testing.T) {
	conns := Connections(observedFlows())
	// Current: db admits web on 5432 (a NetworkPolicy named db).
	cur := policy.NewRepository()
	dbPol := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "db"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}}}}}}
	if _, err := policyk8s.Apply(cur, dbPol); err != nil {
		t.Fatal(err)
	}
	stored, _ := cur.Rules(nil)
	var current api.Rules
	for _, s := range stored {
		current = append(current, s.Rule)
	}
	denyAll := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "deny-all"},
		Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
	rules, err := policyk8s.Translate(denyAll)
	if err != nil {
		t.Fatal(err)
	}
	changes, err := WhatIf(current, []Candidate{{Match: policyk8s.KeyLabels("shop", "deny-all"), Namespace: "shop", Source: "x", Rules: rules}}, conns)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range changes {
		got = append(got, fmt.Sprintf("%s -> %s %d %v>%v", c.Src.Workload(), c.Dst.Workload(), c.Port, c.Before, c.After))
	}
	// web → db stays (the db policy admits it); monitoring → web changes.
	if want := []string{"monitoring/app=prom -> shop/app=web 9090 true>false"}; !slices.Equal(got, want) {
		t.Fatalf("changes %q, want %q", got, want)
	}
	// Replacing the db policy with one that admits nothing changes web → db.
	dbNone := dbPol.DeepCopy()
	dbNone.Spec.Ingress = nil
	rules, err = policyk8s.Translate(dbNone)
	if err != nil {
		t.Fatal(err)
	}
	changes, err = WhatIf(current, []Candidate{{Match: policyk8s.KeyLabels("shop", "db"), Namespace: "shop", Source: "y", Rules: rules}}, conns)
	if err != nil {
		t.Fatal(err)
	}
	groups := GroupChanges(changes)
	if len(groups) != 1 || groups[0].Src != "shop/app=web" || groups[0].Dst != "shop/app=db" || groups[0].Connections != 2 || groups[0].After {
		t.Fatalf("groups %+v: want web -> db, 2 connections, now denied", groups)
	}
}
