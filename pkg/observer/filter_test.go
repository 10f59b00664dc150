package observer

import (
	"net/netip"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

// testFlows is a table of decoded flows the filter cases select from.
func testFlows(t *testing.T) map[string]*flowpb.Flow {
	t.Helper()
	d := &Decoder{Node: fakeNode{}, Clock: fixedClock}
	out := map[string]*flowpb.Flow{}
	add := func(name string, ev func() (*flowpb.Flow, error)) {
		f, err := ev()
		if err != nil {
			t.Fatal(err)
		}
		out[name] = f
	}
	add("deny", func() (*flowpb.Flow, error) {
		ev := dropEvent(webIP, dbIP, 5432, maps.ReasonPolicyDenyRule, time.Second)
		ev.Cookie = 7
		return d.Decode(ev)
	})
	add("default-deny", func() (*flowpb.Flow, error) {
		return d.Decode(dropEvent(webIP, dbIP, 5433, maps.ReasonPolicyDenied, time.Second))
	})
	add("syn", func() (*flowpb.Flow, error) {
		ev := traceEvent(webIP, worldA, 6, 40000, 443, 0x02, maps.DirEgress, maps.ReasonForwarded, 2*time.Second)
		ev.SrcIdentity, ev.DstIdentity = 1000, 2
		return d.Decode(ev)
	})
	add("synack", func() (*flowpb.Flow, error) {
		ev := traceEvent(worldA, webIP, 6, 443, 40000, 0x12, maps.DirIngress, maps.ReasonCTReply, 3*time.Second)
		ev.SrcIdentity, ev.DstIdentity = 2, 1000
		return d.Decode(ev)
	})
	add("dns", func() (*flowpb.Flow, error) {
		return d.Decode(traceEvent(webIP, dbIP, 17, 5000, 53, 0, maps.DirEgress, maps.ReasonForwarded, 4*time.Second))
	})
	// From web's IPv6 address, through web's program (endpoint 1).
	add("ping6", func() (*flowpb.Flow, error) {
		return d.Decode(traceEvent(mustAddr("fd00::a"), mustAddr("fd00::b"), 58, 9, 0, 0, maps.DirEgress, maps.ReasonForwarded, 5*time.Second))
	})
	return out
}

func TestFilters(t *testing.T) {
	flows := testFlows(t)
	all := []string{"deny", "default-deny", "syn", "synack", "dns", "ping6"}
	cases := []struct {
		name        string
		allow, deny []*flowpb.FlowFilter
		want        []string
	}{
		{"none", nil, nil, all},
		{"source ip", ff(func(f *flowpb.FlowFilter) { f.SourceIp = []string{"10.1.0.2"} }), nil, []string{"deny", "default-deny", "syn", "dns"}},
		{"destination cidr", ff(func(f *flowpb.FlowFilter) { f.DestinationIp = []string{"192.0.2.0/24"} }), nil, []string{"syn"}},
		{"ipv6 cidr", ff(func(f *flowpb.FlowFilter) { f.SourceIp = []string{"fd00::/64"} }), nil, []string{"ping6"}},
		{"source pod ns/prefix", ff(func(f *flowpb.FlowFilter) { f.SourcePod = []string{"shop/web"} }), nil, []string{"deny", "default-deny", "syn", "dns", "ping6"}},
		{"pod in either side (two filters)", []*flowpb.FlowFilter{{SourcePod: []string{"data/db"}}, {DestinationPod: []string{"data/db"}}}, nil, []string{"deny", "default-deny", "dns"}},
		{"namespace only", ff(func(f *flowpb.FlowFilter) { f.DestinationPod = []string{"shop/"} }), nil, []string{"synack"}},
		{"pod without namespace is default", ff(func(f *flowpb.FlowFilter) { f.SourcePod = []string{"web"} }), nil, nil},
		{"pod in any namespace", ff(func(f *flowpb.FlowFilter) { f.SourcePod = []string{"/web"} }), nil, []string{"deny", "default-deny", "syn", "dns", "ping6"}},
		{"label", ff(func(f *flowpb.FlowFilter) { f.DestinationLabel = []string{"app=db"} }), nil, []string{"deny", "default-deny", "dns"}},
		{"label with source and set", ff(func(f *flowpb.FlowFilter) { f.DestinationLabel = []string{"k8s:app in (db, cache),tier=backend"} }), nil, []string{"deny", "default-deny", "dns"}},
		{"label other source", ff(func(f *flowpb.FlowFilter) { f.DestinationLabel = []string{"reserved:app=db"} }), nil, nil},
		{"reserved world", ff(func(f *flowpb.FlowFilter) { f.SourceLabel = []string{"reserved:world"} }), nil, []string{"synack"}},
		{"label not", ff(func(f *flowpb.FlowFilter) { f.SourceLabel = []string{"app!=web"} }), nil, []string{"synack"}},
		{"identity", ff(func(f *flowpb.FlowFilter) { f.SourceIdentity = []uint32{2} }), nil, []string{"synack"}},
		{"destination port", ff(func(f *flowpb.FlowFilter) { f.DestinationPort = []string{"443", "53"} }), nil, []string{"syn", "dns"}},
		{"source port", ff(func(f *flowpb.FlowFilter) { f.SourcePort = []string{"443"} }), nil, []string{"synack"}},
		{"protocol", ff(func(f *flowpb.FlowFilter) { f.Protocol = []string{"UDP", "icmp"} }), nil, []string{"dns", "ping6"}},
		{"verdict", ff(func(f *flowpb.FlowFilter) { f.Verdict = []flowpb.Verdict{flowpb.Verdict_DROPPED} }), nil, []string{"deny", "default-deny"}},
		{"drop reason", ff(func(f *flowpb.FlowFilter) { f.DropReasonDesc = []flowpb.DropReason{flowpb.DropReason_POLICY_DENY} }), nil, []string{"deny"}},
		{"event type", ff(func(f *flowpb.FlowFilter) { f.EventType = []*flowpb.EventTypeFilter{{Type: MessageTypeTrace}} }), nil, []string{"syn", "synack", "dns", "ping6"}},
		{"event sub type", ff(func(f *flowpb.FlowFilter) {
			f.EventType = []*flowpb.EventTypeFilter{{Type: MessageTypeTrace, MatchSubType: true, SubType: TraceToEndpoint}}
		}), nil, []string{"synack"}},
		{"node glob", ff(func(f *flowpb.FlowFilter) { f.NodeName = []string{"node-*"} }), nil, all},
		{"node with cluster", ff(func(f *flowpb.FlowFilter) { f.NodeName = []string{"default/node-b"} }), nil, nil},
		{"reply", ff(func(f *flowpb.FlowFilter) { f.Reply = []bool{true} }), nil, []string{"synack"}},
		{"not reply", ff(func(f *flowpb.FlowFilter) { f.Reply = []bool{false} }), nil, []string{"deny", "default-deny", "syn", "dns", "ping6"}},
		{"tcp flags all of", ff(func(f *flowpb.FlowFilter) { f.TcpFlags = []*flowpb.TCPFlags{{SYN: true, ACK: true}} }), nil, []string{"synack"}},
		{"tcp flags syn", ff(func(f *flowpb.FlowFilter) { f.TcpFlags = []*flowpb.TCPFlags{{SYN: true}} }), nil, []string{"deny", "default-deny", "syn", "synack"}},
		{"direction", ff(func(f *flowpb.FlowFilter) {
			f.TrafficDirection = []flowpb.TrafficDirection{flowpb.TrafficDirection_INGRESS}
		}), nil, []string{"deny", "default-deny", "synack"}},
		{"ip version", ff(func(f *flowpb.FlowFilter) { f.IpVersion = []flowpb.IPVersion{flowpb.IPVersion_IPv6} }), nil, []string{"ping6"}},
		{"fields are and-ed", ff(func(f *flowpb.FlowFilter) {
			f.SourcePod = []string{"shop/"}
			f.Verdict = []flowpb.Verdict{flowpb.Verdict_FORWARDED}
		}), nil, []string{"syn", "dns", "ping6"}},
		{"deny list", nil, ff(func(f *flowpb.FlowFilter) { f.Protocol = []string{"tcp"} }), []string{"dns", "ping6"}},
		{"allow and deny", ff(func(f *flowpb.FlowFilter) { f.SourcePod = []string{"shop/"} }),
			ff(func(f *flowpb.FlowFilter) { f.Verdict = []flowpb.Verdict{flowpb.Verdict_DROPPED} }), []string{"syn", "dns", "ping6"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fs, err := CompileFilters(c.allow, c.deny)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, name := range all {
				if fs.Match(flows[name]) {
					got = append(got, name)
				}
			}
			if len(got) != len(c.want) {
				t.Fatalf("matched %v, want %v", got, c.want)
			}
			for i := range got {
				if got[i] != c.want[i] {
					t.Fatalf("matched %v, want %v", got, c.want)
				}
			}
		})
	}
}

func TestFiltersRejectWhatTheyCannotEvaluate(t *testing.T) {
	for _, f := range []*flowpb.FlowFilter{
		{HttpHeader: []*flowpb.HTTPHeader{{Key: "X-Token", Value: "abc"}}},
		{SourceFqdn: []string{"example.com"}},
		{Protocol: []string{"kafka"}},
		{SourcePort: []string{"http"}},
		{SourceIp: []string{"10.0.0.300"}},
		{SourceLabel: []string{"app in web"}},
		{NodeName: []string{"["}},
	} {
		if _, err := CompileFilters([]*flowpb.FlowFilter{f}, nil); err == nil {
			t.Errorf("filter %v compiled", f)
		}
	}
}

func ff(set func(*flowpb.FlowFilter)) []*flowpb.FlowFilter {
	f := &flowpb.FlowFilter{}
	set(f)
	return []*flowpb.FlowFilter{f}
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }
