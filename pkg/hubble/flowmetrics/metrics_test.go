package flowmetrics

import (
	"strings"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

var t0 = time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)

// flowOpt shapes a test flow.
type flowOpt func(*flowpb.Flow)

func tcpFlow(at time.Duration, src string, sport uint32, dst string, dport uint32, flags *flowpb.TCPFlags, opts ...flowOpt) *flowpb.Flow {
	f := &flowpb.Flow{
		Time:      timestamppb.New(t0.Add(at)),
		Verdict:   flowpb.Verdict_FORWARDED,
		EventType: &flowpb.CiliumEventType{Type: eventTrace, SubType: 5},
		IP:        &flowpb.IP{Source: src, Destination: dst},
		L4: &flowpb.Layer4{Protocol: &flowpb.Layer4_TCP{TCP: &flowpb.TCP{
			SourcePort: sport, DestinationPort: dport, Flags: flags}}},
		TraceObservationPoint: flowpb.TraceObservationPoint_FROM_ENDPOINT,
		TraceReason:           flowpb.TraceReason_ESTABLISHED,
		TrafficDirection:      flowpb.TrafficDirection_EGRESS,
		IsReply:               wrapperspb.Bool(false),
		Source:                &flowpb.Endpoint{ID: 7, Namespace: "default", PodName: "client-0"},
		Destination:           &flowpb.Endpoint{Namespace: "shop", PodName: "web-5d9f-x2", Labels: []string{"k8s:app=web"}},
	}
	for _, o := range opts {
		o(f)
	}
	return f
}

func newTrace(f *flowpb.Flow) { f.TraceReason = flowpb.TraceReason_NEW }
func toEndpoint(f *flowpb.Flow) {
	f.TraceObservationPoint = flowpb.TraceObservationPoint_TO_ENDPOINT
	f.EventType.SubType = 0
	f.TrafficDirection = flowpb.TrafficDirection_INGRESS
}
func reply(f *flowpb.Flow) {
	f.IsReply = wrapperspb.Bool(true)
	f.TraceReason = flowpb.TraceReason_REPLY
}
func remoteClient(f *flowpb.Flow) { f.Source.ID = 0 }
func toService(ns, name string) flowOpt {
	return func(f *flowpb.Flow) { f.DestinationService = &flowpb.Service{Namespace: ns, Name: name} }
}
func workload(name string) flowOpt {
	return func(f *flowpb.Flow) { f.Destination.Workloads = []*flowpb.Workload{{Name: name, Kind: "Deployment"}} }
}

var (
	syn    = &flowpb.TCPFlags{SYN: true}
	synAck = &flowpb.TCPFlags{SYN: true, ACK: true}
	ack    = &flowpb.TCPFlags{ACK: true}
)

func drop(reason flowpb.DropReason, dir flowpb.TrafficDirection, denied ...*flowpb.Policy) *flowpb.Flow {
	f := tcpFlow(0, "10.0.0.9", 40000, "10.0.1.2", 22, syn)
	f.Verdict = flowpb.Verdict_DROPPED
	f.EventType = &flowpb.CiliumEventType{Type: eventDrop, SubType: int32(reason)}
	f.DropReasonDesc = reason
	f.TraceObservationPoint = 0
	f.TrafficDirection = dir
	if dir == flowpb.TrafficDirection_INGRESS {
		f.IngressDeniedBy = denied
	} else {
		f.EgressDeniedBy = denied
	}
	return f
}

func verdict(dir flowpb.TrafficDirection, match uint32, v flowpb.Verdict) *flowpb.Flow {
	f := tcpFlow(0, "10.0.0.9", 40000, "10.0.1.2", 80, syn)
	f.EventType = &flowpb.CiliumEventType{Type: eventPolicyVerdict}
	f.TraceObservationPoint = 0
	f.TrafficDirection = dir
	f.PolicyMatchType = match
	f.Verdict = v
	return f
}

func TestMetricsFromFlows(t *testing.T) {
	ingress, egress := flowpb.TrafficDirection_INGRESS, flowpb.TrafficDirection_EGRESS
	denyDB := &flowpb.Policy{Namespace: "data", Name: "db-deny-ssh", Kind: "CiliumNetworkPolicy"}
	clusterwide := &flowpb.Policy{Name: "block-metadata", Kind: "CiliumClusterwideNetworkPolicy"}

	tests := []struct {
		name  string
		flows []*flowpb.Flow
		// want is the exposition text of the named metrics.
		metrics []string
		want    string
	}{{
		name: "flows by type, sub-type and verdict",
		flows: []*flowpb.Flow{
			tcpFlow(0, "10.0.0.1", 1000, "10.0.0.2", 80, syn, newTrace),
			tcpFlow(0, "10.0.0.1", 1000, "10.0.0.2", 80, syn, newTrace, toEndpoint),
			tcpFlow(0, "10.0.0.1", 1000, "10.0.0.2", 80, ack),
			drop(flowpb.DropReason_POLICY_DENIED, ingress),
			verdict(ingress, MatchL3L4, flowpb.Verdict_FORWARDED),
		},
		metrics: []string{"tendril_hubble_flows_processed_total"},
		want: `
# HELP tendril_hubble_flows_processed_total Flows decoded, by event type, sub-type (observation point of traces) and verdict.
# TYPE tendril_hubble_flows_processed_total counter
tendril_hubble_flows_processed_total{subtype="",type="drop",verdict="DROPPED"} 1
tendril_hubble_flows_processed_total{subtype="",type="policy-verdict",verdict="FORWARDED"} 1
tendril_hubble_flows_processed_total{subtype="from-endpoint",type="trace",verdict="FORWARDED"} 2
tendril_hubble_flows_processed_total{subtype="to-endpoint",type="trace",verdict="FORWARDED"} 1
`,
	}, {
		name: "drops by reason; policy drops name their policy or the default deny",
		flows: []*flowpb.Flow{
			drop(flowpb.DropReason_POLICY_DENIED, ingress),
			drop(flowpb.DropReason_POLICY_DENIED, egress),
			drop(flowpb.DropReason_POLICY_DENY, ingress, denyDB),
			drop(flowpb.DropReason_POLICY_DENY, ingress, denyDB),
			drop(flowpb.DropReason_POLICY_DENY, egress, clusterwide),
			drop(flowpb.DropReason_INVALID_SOURCE_IP, egress),
		},
		metrics: []string{"tendril_hubble_drop_total", "tendril_hubble_policy_drops_total"},
		want: `
# HELP tendril_hubble_drop_total Dropped flows by drop reason and protocol.
# TYPE tendril_hubble_drop_total counter
tendril_hubble_drop_total{protocol="TCP",reason="INVALID_SOURCE_IP"} 1
tendril_hubble_drop_total{protocol="TCP",reason="POLICY_DENIED"} 2
tendril_hubble_drop_total{protocol="TCP",reason="POLICY_DENY"} 3
# HELP tendril_hubble_policy_drops_total Flows dropped by policy, by direction and the policy that denied them (namespace/name, or "default deny").
# TYPE tendril_hubble_policy_drops_total counter
tendril_hubble_policy_drops_total{direction="egress",policy="block-metadata"} 1
tendril_hubble_policy_drops_total{direction="egress",policy="default deny"} 1
tendril_hubble_policy_drops_total{direction="ingress",policy="data/db-deny-ssh"} 2
tendril_hubble_policy_drops_total{direction="ingress",policy="default deny"} 1
`,
	}, {
		name: "policy verdicts by match type",
		flows: []*flowpb.Flow{
			verdict(ingress, MatchL3Only, flowpb.Verdict_FORWARDED),
			verdict(ingress, MatchL3L4, flowpb.Verdict_FORWARDED),
			verdict(egress, MatchAll, flowpb.Verdict_FORWARDED),
			verdict(egress, MatchL4Only, flowpb.Verdict_FORWARDED),
		},
		metrics: []string{"tendril_hubble_policy_verdicts_total"},
		want: `
# HELP tendril_hubble_policy_verdicts_total Policy verdicts on new flows, by direction, match type and action.
# TYPE tendril_hubble_policy_verdicts_total counter
tendril_hubble_policy_verdicts_total{action="allowed",direction="egress",match="all"} 1
tendril_hubble_policy_verdicts_total{action="allowed",direction="egress",match="l4-only"} 1
tendril_hubble_policy_verdicts_total{action="allowed",direction="ingress",match="l3-l4"} 1
tendril_hubble_policy_verdicts_total{action="allowed",direction="ingress",match="l3-only"} 1
`,
	}, {
		name: "new connections per service, once per connection",
		flows: []*flowpb.Flow{
			// A local client: its from-endpoint NEW counts, the server's
			// to-endpoint NEW of the same connection does not.
			tcpFlow(0, "10.0.0.1", 1000, "10.0.0.2", 80, syn, newTrace, toService("shop", "web")),
			tcpFlow(0, "10.0.0.1", 1000, "10.0.0.2", 80, syn, newTrace, toEndpoint, toService("shop", "web")),
			// A client on another node: only the to-endpoint trace exists.
			tcpFlow(0, "10.0.9.1", 2000, "10.0.0.2", 80, syn, newTrace, toEndpoint, remoteClient, toService("shop", "web")),
			// Established packets and replies are no new connection.
			tcpFlow(0, "10.0.0.1", 1000, "10.0.0.2", 80, ack, toService("shop", "web")),
			tcpFlow(0, "10.0.0.2", 80, "10.0.0.1", 1000, synAck, reply, toService("shop", "web")),
			// No service: not counted.
			tcpFlow(0, "10.0.0.1", 1001, "10.0.0.3", 80, syn, newTrace),
			tcpFlow(0, "10.0.0.1", 1002, "10.0.0.4", 53, syn, newTrace, toService("kube-system", "kube-dns")),
		},
		metrics: []string{"tendril_hubble_service_new_connections_total"},
		want: `
# HELP tendril_hubble_service_new_connections_total New connections to a service (namespace/name), by protocol.
# TYPE tendril_hubble_service_new_connections_total counter
tendril_hubble_service_new_connections_total{protocol="TCP",service="kube-system/kube-dns"} 1
tendril_hubble_service_new_connections_total{protocol="TCP",service="shop/web"} 2
`,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			m, err := New(Config{Metrics: All}, reg)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range tc.flows {
				m.Observe(f)
			}
			if err := testutil.GatherAndCompare(reg, strings.NewReader(tc.want), tc.metrics...); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestConnectRTT checks the SYN to SYN-ACK histogram from the flows'
// timestamps: per service and destination workload, a retransmitted SYN
// keeps the first SYN's time, a SYN-ACK without its SYN records nothing.
func TestConnectRTT(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name  string
		flows []*flowpb.Flow
		// want: per "service|workload", the count and sum in seconds.
		want map[string][2]float64
	}{{
		name: "one connect to a service's workload",
		flows: []*flowpb.Flow{
			tcpFlow(0, "10.0.0.1", 1000, "10.0.0.2", 80, syn, toService("shop", "web"), workload("web")),
			tcpFlow(3*ms, "10.0.0.2", 80, "10.0.0.1", 1000, synAck, reply),
		},
		want: map[string][2]float64{"shop/web|shop/web": {1, 0.003}},
	}, {
		name: "a retransmitted SYN keeps the first one's time",
		flows: []*flowpb.Flow{
			tcpFlow(0, "10.0.0.1", 1000, "10.0.0.2", 80, syn),
			tcpFlow(1000*ms, "10.0.0.1", 1000, "10.0.0.2", 80, syn),
			tcpFlow(1002*ms, "10.0.0.2", 80, "10.0.0.1", 1000, synAck, reply),
		},
		want: map[string][2]float64{"none|shop/web": {1, 1.002}},
	}, {
		name: "two connections; one never answered, one answered twice",
		flows: []*flowpb.Flow{
			tcpFlow(0, "10.0.0.1", 1000, "10.0.0.2", 80, syn),
			tcpFlow(ms, "10.0.0.1", 1001, "10.0.0.2", 80, syn),
			tcpFlow(2*ms, "10.0.0.2", 80, "10.0.0.1", 1001, synAck, reply),
			tcpFlow(5*ms, "10.0.0.2", 80, "10.0.0.1", 1001, synAck, reply),
		},
		want: map[string][2]float64{"none|shop/web": {1, 0.001}},
	}, {
		name: "a SYN-ACK alone, a dropped SYN and a SYN-ACK of another tuple record nothing",
		flows: []*flowpb.Flow{
			tcpFlow(0, "10.0.0.2", 80, "10.0.0.1", 1000, synAck, reply),
			func() *flowpb.Flow {
				f := drop(flowpb.DropReason_POLICY_DENIED, flowpb.TrafficDirection_INGRESS)
				return f
			}(),
			tcpFlow(ms, "10.0.0.2", 22, "10.0.0.9", 40000, synAck, reply),
			tcpFlow(2*ms, "10.0.0.1", 1000, "10.0.0.3", 80, syn),
			tcpFlow(3*ms, "10.0.0.3", 80, "10.0.0.1", 1001, synAck, reply),
		},
		want: map[string][2]float64{},
	}, {
		name: "destination workload from the app label, a reserved label, or unknown",
		flows: []*flowpb.Flow{
			tcpFlow(0, "10.0.0.1", 1000, "10.0.0.2", 80, syn),
			tcpFlow(ms, "10.0.0.2", 80, "10.0.0.1", 1000, synAck, reply),
			tcpFlow(0, "10.0.0.1", 1001, "192.0.2.1", 443, syn, func(f *flowpb.Flow) {
				f.Destination = &flowpb.Endpoint{Identity: 2, Labels: []string{"reserved:world"}}
			}),
			tcpFlow(4*ms, "192.0.2.1", 443, "10.0.0.1", 1001, synAck, reply),
			tcpFlow(0, "10.0.0.1", 1002, "10.0.0.7", 80, syn, func(f *flowpb.Flow) {
				f.Destination = &flowpb.Endpoint{Namespace: "x", PodName: "lonely-pod"}
			}),
			tcpFlow(2*ms, "10.0.0.7", 80, "10.0.0.1", 1002, synAck, reply),
		},
		want: map[string][2]float64{"none|shop/web": {1, 0.001}, "none|reserved:world": {1, 0.004}, "none|unknown": {1, 0.002}},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			m, err := New(Config{Metrics: []string{MetricTCPConnect}}, reg)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range tc.flows {
				m.Observe(f)
			}
			got := histograms(t, reg)
			if len(got) != len(tc.want) {
				t.Fatalf("histograms %v, want %v", got, tc.want)
			}
			for k, w := range tc.want {
				g, ok := got[k]
				if !ok || g[0] != w[0] || g[1] < w[1]-1e-9 || g[1] > w[1]+1e-9 {
					t.Fatalf("%s: count/sum %v, want %v (all: %v)", k, g, w, got)
				}
			}
		})
	}
}

// histograms gathers the RTT histogram: "service|workload" to count, sum.
func histograms(t *testing.T, reg *prometheus.Registry) map[string][2]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][2]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "tendril_hubble_tcp_connect_rtt_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			h := m.GetHistogram()
			out[l["service"]+"|"+l["destination_workload"]] = [2]float64{float64(h.GetSampleCount()), h.GetSampleSum()}
		}
	}
	return out
}

// TestLabelCardinalityBounded: past MaxLabelValues distinct services, the
// others count as "other"; the SYNs waiting are bounded by MaxPending.
func TestLabelCardinalityBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := New(Config{Metrics: All, MaxLabelValues: 3, MaxPending: 10}, reg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		m.Observe(tcpFlow(0, "10.0.0.1", uint32(1000+i), "10.0.0.2", 80, syn, newTrace, toService("ns", string(rune('a'+i)))))
	}
	want := `
# HELP tendril_hubble_service_new_connections_total New connections to a service (namespace/name), by protocol.
# TYPE tendril_hubble_service_new_connections_total counter
tendril_hubble_service_new_connections_total{protocol="TCP",service="ns/a"} 1
tendril_hubble_service_new_connections_total{protocol="TCP",service="ns/b"} 1
tendril_hubble_service_new_connections_total{protocol="TCP",service="ns/c"} 1
tendril_hubble_service_new_connections_total{protocol="TCP",service="other"} 3
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "tendril_hubble_service_new_connections_total"); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		m.Observe(tcpFlow(time.Duration(i)*time.Millisecond, "10.0.0.1", uint32(2000+i), "10.0.0.2", 80, syn))
	}
	if n := m.connects.Len(); n != 10 {
		t.Fatalf("%d SYNs waiting, want the bound 10", n)
	}
	// The oldest went first: the newest SYN is still answered.
	m.Observe(tcpFlow(200*time.Millisecond, "10.0.0.2", 80, "10.0.0.1", 2099, synAck, reply))
	if got := histograms(t, reg)["none|shop/web"]; got[0] != 1 {
		t.Fatalf("RTT of the newest SYN not recorded: %v", got)
	}
	// A SYN older than PendingTimeout goes when a new one comes.
	m.Observe(tcpFlow(200*time.Millisecond+PendingTimeout+time.Second, "10.0.0.1", 3000, "10.0.0.2", 80, syn))
	if n := m.connects.Len(); n != 1 {
		t.Fatalf("%d SYNs waiting after the timeout, want 1", n)
	}
}

func TestConfigValidate(t *testing.T) {
	if err := (Config{Metrics: []string{"flow", "kafka"}}).Validate(); err == nil || !strings.Contains(err.Error(), `"kafka"`) {
		t.Fatalf("unknown metric: %v", err)
	}
	if err := (Config{Metrics: All}).Validate(); err != nil {
		t.Fatal(err)
	}
}
