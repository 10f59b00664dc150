package observer_test

import (
	"net/netip"
	"strings"
	"testing"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tendril-net/tendril/pkg/hubble/flowmetrics"
	"github.com/tendril-net/tendril/pkg/hubble/hubbletest"
	"github.com/tendril-net/tendril/pkg/observer"
)

var (
	frontend = netip.MustParseAddrPort("10.96.0.10:80")
	backend  = netip.AddrPortFrom(hubbletest.DBIP, 5432)
)

// serviceNode is the test node that also knows the service data/db.
type serviceNode struct{ hubbletest.Node }

func (serviceNode) ServiceByAddr(a netip.AddrPort, proto uint8) (observer.Service, bool) {
	if proto == 6 && (a == frontend || a == backend) {
		return observer.Service{Namespace: "data", Name: "db"}, true
	}
	return observer.Service{}, false
}

// TestPrivilegedTranslatedFlowNamesService: web connects to the service
// data/db at its cluster IP; the pod programs (BPF_PROG_TEST_RUN) translate
// the SYN to the backend and the SYN-ACK back. The events read from the
// ring buffer decode into flows that carry the backend's address and name
// the service (destination on the way there, source on the way back), and
// the flow metrics count the new connection and its round trip under it.
func TestPrivilegedTranslatedFlowNamesService(t *testing.T) {
	const syn, ack = 0x02, 0x10
	web := hubbletest.WebIP
	pkts := []hubbletest.Packet{
		// web's SYN to the cluster IP, translated by web's from_pod.
		{FromPod: true, Endpoint: 1, Src: web, Dst: frontend.Addr(), Proto: 6, Sport: 40000, Dport: frontend.Port(), TCPFlags: syn},
		// The host delivers it to db (to_pod: db's ingress admits web).
		{FromPod: false, Endpoint: 2, Src: web, Dst: backend.Addr(), Proto: 6, Sport: 40000, Dport: backend.Port(), TCPFlags: syn},
		// db's SYN-ACK, and web's to_pod turning its source back into
		// the frontend.
		{FromPod: true, Endpoint: 2, Src: backend.Addr(), Dst: web, Proto: 6, Sport: backend.Port(), Dport: 40000, TCPFlags: syn | ack},
		{FromPod: false, Endpoint: 1, Src: backend.Addr(), Dst: web, Proto: 6, Sport: backend.Port(), Dport: 40000, TCPFlags: syn | ack},
	}
	evs := hubbletest.ServiceEvents(t, pkts, []hubbletest.ServiceBackend{{Frontend: frontend, Backend: backend}})

	reg := prometheus.NewRegistry()
	m, err := flowmetrics.New(flowmetrics.Config{Metrics: flowmetrics.All}, reg)
	if err != nil {
		t.Fatal(err)
	}
	o := observer.New(observer.Config{Consumers: []func(*flowpb.Flow){m.Observe}}, serviceNode{hubbletest.Node{Name: "node-a"}}, nil)
	var flows []*flowpb.Flow
	for _, ev := range evs {
		if err := o.Observe(ev); err != nil {
			t.Fatal(err)
		}
		f, _ := o.Ring().At(o.Ring().Seen() - 1)
		flows = append(flows, f)
	}
	var there, back bool
	for _, f := range flows {
		tcp := f.GetL4().GetTCP()
		switch {
		case f.GetEventType().GetType() == observer.MessageTypeTrace && f.GetTraceObservationPoint() == flowpb.TraceObservationPoint_FROM_ENDPOINT &&
			f.GetSource().GetPodName() == "web-7d9f" && tcp.GetFlags().GetSYN() && !tcp.GetFlags().GetACK():
			there = true
			if f.GetIP().GetDestination() != backend.Addr().String() || tcp.GetDestinationPort() != uint32(backend.Port()) {
				t.Errorf("web's SYN as its from_pod saw it: to %s:%d, want the backend %s", f.GetIP().GetDestination(), tcp.GetDestinationPort(), backend)
			}
			if s := f.GetDestinationService(); s.GetNamespace() != "data" || s.GetName() != "db" {
				t.Errorf("web's SYN names service %v, want data/db", s)
			}
		case f.GetEventType().GetType() == observer.MessageTypeTrace && tcp.GetFlags().GetSYN() && tcp.GetFlags().GetACK():
			back = true
			if s := f.GetSourceService(); s.GetName() != "db" {
				t.Errorf("the SYN-ACK (%s:%d -> %s) names source service %v, want data/db", f.GetIP().GetSource(), tcp.GetSourcePort(), f.GetIP().GetDestination(), s)
			}
		}
	}
	if !there || !back {
		t.Fatalf("flows of the translated connection: SYN %v, SYN-ACK %v (of %d events: %v)", there, back, len(evs), flows)
	}
	want := `
# HELP tendril_hubble_service_new_connections_total New connections to a service (namespace/name), by protocol.
# TYPE tendril_hubble_service_new_connections_total counter
tendril_hubble_service_new_connections_total{protocol="TCP",service="data/db"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "tendril_hubble_service_new_connections_total"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(reg, "tendril_hubble_tcp_connect_rtt_seconds"); n != 1 {
		t.Errorf("%d RTT series, want one (data/db, data/db's workload)", n)
	}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "tendril_hubble_tcp_connect_rtt_seconds" {
			continue
		}
		for _, s := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range s.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["service"] != "data/db" || labels["destination_workload"] != "data/db" || s.GetHistogram().GetSampleCount() != 1 {
				t.Errorf("RTT series %v with %d samples, want service and workload data/db, 1 sample", labels, s.GetHistogram().GetSampleCount())
			}
		}
	}
}
