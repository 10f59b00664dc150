package observer

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"

	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

func TestDecodeDropNamesPodsReasonAndPolicy(t *testing.T) {
	d := &Decoder{Node: fakeNode{}, Clock: fixedClock}
	ev := dropEvent(webIP, dbIP, 5432, maps.ReasonPolicyDenyRule, 1500*time.Millisecond)
	ev.Cookie = 7
	f, err := d.Decode(ev)
	if err != nil {
		t.Fatal(err)
	}
	if f.GetVerdict() != flowpb.Verdict_DROPPED || f.GetDropReasonDesc() != flowpb.DropReason_POLICY_DENY || f.GetEventType().GetType() != MessageTypeDrop {
		t.Errorf("verdict %v reason %v type %v", f.GetVerdict(), f.GetDropReasonDesc(), f.GetEventType())
	}
	if got := f.GetTime().AsTime(); !got.Equal(base.Add(1500 * time.Millisecond)) {
		t.Errorf("time %v, want %v", got, base.Add(1500*time.Millisecond))
	}
	if f.GetSource().GetPodName() != "web-7d9f" || f.GetSource().GetNamespace() != "shop" || f.GetSource().GetWorkloads()[0].GetName() != "web" {
		t.Errorf("source %v", f.GetSource())
	}
	if f.GetDestination().GetPodName() != "db-0" || f.GetDestination().GetIdentity() != 1001 || f.GetDestination().GetID() != 2 {
		t.Errorf("destination %v", f.GetDestination())
	}
	if f.GetTrafficDirection() != flowpb.TrafficDirection_INGRESS || f.GetNodeName() != "node-a" || f.GetIsReply().GetValue() {
		t.Errorf("direction %v node %q reply %v", f.GetTrafficDirection(), f.GetNodeName(), f.GetIsReply())
	}
	if p := f.GetIngressDeniedBy(); len(p) != 1 || p[0].GetName() != "db-ingress" || p[0].GetNamespace() != "data" {
		t.Errorf("ingress denied by %v", p)
	}
	if tcp := f.GetL4().GetTCP(); tcp.GetDestinationPort() != 5432 || !tcp.GetFlags().GetSYN() || tcp.GetFlags().GetACK() {
		t.Errorf("l4 %v", f.GetL4())
	}
	if f.GetIP().GetSource() != "10.1.0.2" || f.GetIP().GetIpVersion() != flowpb.IPVersion_IPv4 || len(f.GetUuid()) != 36 {
		t.Errorf("ip %v uuid %q", f.GetIP(), f.GetUuid())
	}

	// Default deny names no policy.
	f, _ = d.Decode(dropEvent(webIP, dbIP, 5432, maps.ReasonPolicyDenied, 0))
	if f.GetDropReasonDesc() != flowpb.DropReason_POLICY_DENIED || len(f.GetIngressDeniedBy()) != 0 {
		t.Errorf("default deny: %v %v", f.GetDropReasonDesc(), f.GetIngressDeniedBy())
	}
}

func TestDecodeTraceAndVerdict(t *testing.T) {
	d := &Decoder{Node: fakeNode{}, Clock: fixedClock}
	// A reply to web from the world: the remote side is named by its
	// identity's labels.
	ev := traceEvent(worldA, webIP, 6, 443, 40000, 0x12, maps.DirIngress, maps.ReasonCTReply, 0)
	ev.SrcIdentity, ev.DstIdentity = 2, 1000
	f, err := d.Decode(ev)
	if err != nil {
		t.Fatal(err)
	}
	if f.GetVerdict() != flowpb.Verdict_FORWARDED || f.GetTraceObservationPoint() != flowpb.TraceObservationPoint_TO_ENDPOINT ||
		f.GetEventType().GetType() != MessageTypeTrace || f.GetEventType().GetSubType() != TraceToEndpoint || !f.GetIsReply().GetValue() ||
		f.GetTraceReason() != flowpb.TraceReason_REPLY {
		t.Errorf("trace flow: %v", f)
	}
	if l := f.GetSource().GetLabels(); len(l) != 1 || l[0] != "reserved:world" || f.GetDestination().GetPodName() != "web-7d9f" {
		t.Errorf("source %v destination %v", f.GetSource(), f.GetDestination())
	}
	// An allowed verdict names the rule that allowed it.
	v := loader.Event{Type: maps.EventPolicyVerdict, Direction: maps.DirEgress, EndpointID: 1, Proto: 17, Allowed: true, Cookie: 7,
		Src: webIP, Dst: dbIP, SrcPort: 5000, DstPort: 53, SrcIdentity: 1000, DstIdentity: 1001, Monotonic: at(0)}
	f, _ = d.Decode(v)
	if f.GetEventType().GetType() != MessageTypePolicyVerdict || len(f.GetEgressAllowedBy()) != 1 || f.GetL4().GetUDP().GetDestinationPort() != 53 {
		t.Errorf("verdict flow: %v", f)
	}
	// An audited policy would have denied the flow: AUDIT, naming it among
	// the policies that deny.
	v.Audit = true
	f, _ = d.Decode(v)
	if f.GetVerdict() != flowpb.Verdict_AUDIT || len(f.GetEgressDeniedBy()) != 1 || len(f.GetEgressAllowedBy()) != 0 {
		t.Errorf("audit flow: %v", f)
	}
	// ICMP echo request: the identifier is in the source port.
	icmp := traceEvent(webIP, worldA, 1, 7, 0, 0, maps.DirEgress, maps.ReasonForwarded, 0)
	f, _ = d.Decode(icmp)
	if f.GetL4().GetICMPv4().GetType() != 8 || f.GetTraceObservationPoint() != flowpb.TraceObservationPoint_FROM_ENDPOINT {
		t.Errorf("icmp flow: %v", f)
	}
	if _, err := d.Decode(loader.Event{Type: 99}); err == nil {
		t.Error("an unknown event type decoded")
	}
}

// serviceNode also knows a service: its cluster IP and its backend db.
type serviceNode struct{ fakeNode }

var clusterIP = netip.MustParseAddr("10.96.0.10")

func (serviceNode) ServiceByAddr(a netip.AddrPort, proto uint8) (Service, bool) {
	if proto == 6 && (a == netip.AddrPortFrom(clusterIP, 5432) || a == netip.AddrPortFrom(dbIP, 5432)) {
		return Service{Namespace: "data", Name: "db"}, true
	}
	return Service{}, false
}

func TestDecodeServiceAndMatchType(t *testing.T) {
	d := &Decoder{Node: serviceNode{}, Clock: fixedClock}
	// A connection to the service's backend (the socket load balancer
	// translated the cluster IP away) names the service.
	ev := traceEvent(webIP, dbIP, 6, 40000, 5432, 0x02, maps.DirEgress, maps.ReasonForwarded, 0)
	f, err := d.Decode(ev)
	if err != nil {
		t.Fatal(err)
	}
	if s := f.GetDestinationService(); s.GetName() != "db" || s.GetNamespace() != "data" || f.GetSourceService() != nil {
		t.Errorf("services: source %v destination %v", f.GetSourceService(), f.GetDestinationService())
	}
	// The reply names it as its source.
	f, _ = d.Decode(traceEvent(dbIP, webIP, 6, 5432, 40000, 0x12, maps.DirIngress, maps.ReasonCTReply, 0))
	if f.GetSourceService().GetName() != "db" || f.GetDestinationService() != nil {
		t.Errorf("reply services: source %v destination %v", f.GetSourceService(), f.GetDestinationService())
	}
	// Without service knowledge, no service.
	f, _ = (&Decoder{Node: fakeNode{}, Clock: fixedClock}).Decode(ev)
	if f.GetDestinationService() != nil {
		t.Errorf("service %v from a node that knows none", f.GetDestinationService())
	}
	// A verdict carries the match type of the entry that allowed it.
	v := loader.Event{Type: maps.EventPolicyVerdict, Direction: maps.DirIngress, EndpointID: 2, Proto: 6, Allowed: true, Cookie: 7,
		Src: webIP, Dst: dbIP, SrcPort: 40000, DstPort: 5432, MatchType: maps.PolicyMatchL3L4, Monotonic: at(0)}
	f, _ = d.Decode(v)
	if f.GetPolicyMatchType() != uint32(maps.PolicyMatchL3L4) || f.GetPolicyMatchType() != 2 {
		t.Errorf("match type %d, want L3-L4 (2)", f.GetPolicyMatchType())
	}
}

// TestConsumersSeeEveryFlow: the observer hands each decoded flow to its
// consumers before it enters the ring.
func TestConsumersSeeEveryFlow(t *testing.T) {
	var seen []*flowpb.Flow
	var o *Observer
	o = New(Config{Clock: fixedClock, Consumers: []func(*flowpb.Flow){func(f *flowpb.Flow) {
		if _, next, _ := o.Ring().Bounds(); next != uint64(len(seen)) {
			t.Errorf("flow %d in the ring before its consumer saw it", next)
		}
		seen = append(seen, f)
	}}}, fakeNode{}, nil)
	for i := range 3 {
		if err := o.Observe(traceEvent(webIP, dbIP, 6, 40000+uint16(i), 5432, 0x02, maps.DirEgress, maps.ReasonForwarded, 0)); err != nil {
			t.Fatal(err)
		}
	}
	_ = o.Observe(loader.Event{Type: 99})
	if len(seen) != 3 {
		t.Fatalf("consumers saw %d flows, want 3", len(seen))
	}
	for i, f := range seen {
		if g, _ := o.Ring().At(uint64(i)); g != f {
			t.Fatalf("flow %d: the consumer's is not the ring's", i)
		}
	}
}

// defaultDenyNode knows which policy selects db on ingress.
type defaultDenyNode struct{ fakeNode }

func (defaultDenyNode) DefaultDenyPolicies(ep uint16, ingress bool) []Policy {
	if ep == 2 && ingress {
		return []Policy{{Name: "db-ingress", Namespace: "data", Kind: "CiliumNetworkPolicy"}}
	}
	if ep == 0 && ingress {
		return []Policy{{Name: "host-fw", Kind: "TendrilClusterwideNetworkPolicy"}}
	}
	return nil
}

// TestDecodeHostFirewallDropNamesHostPolicy: a policy drop of the host
// endpoint (endpoint 0, the host firewall) names the host policy that
// selects the node.
func TestDecodeHostFirewallDropNamesHostPolicy(t *testing.T) {
	d := &Decoder{Node: defaultDenyNode{}, Clock: fixedClock}
	ev := dropEvent(webIP, dbIP, 30080, maps.ReasonPolicyDenied, 0)
	ev.EndpointID = 0
	f, err := d.Decode(ev)
	if err != nil {
		t.Fatal(err)
	}
	if by := f.GetIngressDeniedBy(); len(by) != 1 || by[0].GetName() != "host-fw" {
		t.Errorf("host firewall drop: denied by %v, want host-fw", by)
	}
}

// TestDecodeDefaultDenyNamesSelectingPolicy: a default-deny drop names the
// policies selecting the endpoint in its direction, its reason still the
// default deny's.
func TestDecodeDefaultDenyNamesSelectingPolicy(t *testing.T) {
	d := &Decoder{Node: defaultDenyNode{}, Clock: fixedClock}
	f, err := d.Decode(dropEvent(webIP, dbIP, 5432, maps.ReasonPolicyDenied, 0))
	if err != nil {
		t.Fatal(err)
	}
	if by := f.GetIngressDeniedBy(); f.GetDropReasonDesc() != flowpb.DropReason_POLICY_DENIED || len(by) != 1 || by[0].GetName() != "db-ingress" || by[0].GetNamespace() != "data" {
		t.Errorf("default deny: reason %v, denied by %v", f.GetDropReasonDesc(), by)
	}
	eg := dropEvent(dbIP, webIP, 80, maps.ReasonPolicyDenied, 0)
	eg.Direction = maps.DirEgress
	if f, _ := d.Decode(eg); len(f.GetEgressDeniedBy())+len(f.GetIngressDeniedBy()) != 0 {
		t.Errorf("egress default deny of an endpoint no egress rule selects names %v %v", f.GetEgressDeniedBy(), f.GetIngressDeniedBy())
	}
}

// A connection the socket load-balancer translated at connect: a SOCK
// flow (trace-sock) from the client's socket to the backend, naming the
// service whose frontend it asked for.
func TestDecodeSocketTranslation(t *testing.T) {
	d := &Decoder{Node: serviceNode{}, Clock: fixedClock}
	ev := loader.Event{Type: maps.EventSockXlate, Reason: maps.ReasonForwarded, Direction: maps.DirEgress, Proto: 6, Allowed: true, Cookie: 3,
		Src: clusterIP, SrcPort: 5432, Dst: dbIP, DstPort: 5432, Monotonic: at(0)}
	f, err := d.Decode(ev)
	if err != nil {
		t.Fatal(err)
	}
	if f.GetType() != flowpb.FlowType_SOCK || f.GetEventType().GetType() != MessageTypeTraceSock ||
		f.GetSockXlatePoint() != flowpb.SocketTranslationPoint_SOCK_XLATE_POINT_POST_DIRECTION_FWD || f.GetVerdict() != flowpb.Verdict_TRACED {
		t.Errorf("socket translation flow: %v", f)
	}
	if f.GetIP().GetDestination() != dbIP.String() || f.GetIP().GetSource() != "" || f.GetL4().GetTCP().GetDestinationPort() != 5432 || f.GetL4().GetTCP().GetSourcePort() != 0 {
		t.Errorf("addresses: %v %v", f.GetIP(), f.GetL4())
	}
	if s := f.GetDestinationService(); s.GetName() != "db" || s.GetNamespace() != "data" {
		t.Errorf("service %v", s)
	}
	if f.GetDestination().GetPodName() == "" {
		t.Errorf("destination %v: want the backend pod", f.GetDestination())
	}
}

// cgroupNode knows one cgroup's pod.
type cgroupNode struct{ serviceNode }

func (cgroupNode) EndpointByCgroup(id uint64) (Endpoint, bool) {
	if id != 0x1_0000_002a {
		return Endpoint{}, false
	}
	return Endpoint{ID: 9, Identity: 4242, Namespace: "shop", PodName: "client-7d9f", Labels: []string{"k8s:app=client"}}, true
}

// A socket translation event's cgroup names the client pod as the flow's
// source (pod → service); an unknown cgroup leaves the source empty.
func TestDecodeSocketTranslationNamesClientPod(t *testing.T) {
	d := &Decoder{Node: cgroupNode{}, Clock: fixedClock}
	ev := loader.Event{Type: maps.EventSockXlate, Reason: maps.ReasonForwarded, Direction: maps.DirEgress, Proto: 6, Allowed: true, Cookie: 3,
		Src: clusterIP, SrcPort: 5432, Dst: dbIP, DstPort: 5432, Monotonic: at(0), CgroupID: 0x1_0000_002a}
	f, err := d.Decode(ev)
	if err != nil {
		t.Fatal(err)
	}
	if s := f.GetSource(); s.GetPodName() != "client-7d9f" || s.GetNamespace() != "shop" || s.GetIdentity() != 4242 || s.GetID() != 9 || len(s.GetLabels()) != 1 {
		t.Errorf("source %v: want the client pod", s)
	}
	if f.GetDestinationService().GetName() != "db" {
		t.Errorf("service %v", f.GetDestinationService())
	}
	ev.CgroupID = 7
	if f, _ := d.Decode(ev); f.GetSource().GetPodName() != "" {
		t.Errorf("unknown cgroup: source %v", f.GetSource())
	}
}

// TestEveryDropReasonHasHubbleReason: each reason the datapath drops with
// reaches Hubble as a reason of its list, not DROP_REASON_UNKNOWN (a drop
// of the tunnel's showed as unknown in `tendril observe`), but the one
// with no counterpart. The reasons from ReasonPolicyDenied on are drops,
// but ReasonToOverlay.
func TestEveryDropReasonHasHubbleReason(t *testing.T) {
	names := maps.ReasonNames()
	for r := maps.ReasonPolicyDenied; int(r) < len(names); r++ {
		if r == maps.ReasonToOverlay || r == maps.ReasonDsrMtuExceeded {
			continue
		}
		if got := DropReason(r); got == flowpb.DropReason_DROP_REASON_UNKNOWN {
			t.Errorf("drop reason %d (%s) reaches Hubble as %s", r, names[r], got)
		}
	}
}

// formatUUID gives what the five %x of fmt gave, for bytes of every value.
func TestFormatUUID(t *testing.T) {
	for seed := range 64 {
		var b [16]byte
		for i := range b {
			b[i] = byte(seed*16 + i*37)
		}
		want := fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
		if got := formatUUID(b); got != want {
			t.Fatalf("formatUUID(%x) = %q, want %q", b, got, want)
		}
	}
	if u := newUUID(); len(u) != 36 || u[14] != '4' || !strings.ContainsRune("89ab", rune(u[19])) {
		t.Errorf("newUUID() = %q: not a version 4 UUID", u)
	}
}
