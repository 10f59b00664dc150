package observer

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	flowpb "github.com/cilium/cilium/api/v1/flow"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

// dnsFlow is a flow as the DNS proxy builds it: the sender's endpoint ID
// and identity, addresses, the record; no node, UUID or time.
func dnsFlow(src Endpoint, srcIP, dstIP string) *flowpb.Flow {
	return &flowpb.Flow{Type: flowpb.FlowType_L7, EventType: &flowpb.CiliumEventType{Type: MessageTypeAccessLog},
		Verdict: flowpb.Verdict_FORWARDED, IP: &flowpb.IP{Source: srcIP, Destination: dstIP},
		L4:     &flowpb.Layer4{Protocol: &flowpb.Layer4_UDP{UDP: &flowpb.UDP{SourcePort: 34561, DestinationPort: 53}}},
		Source: &flowpb.Endpoint{ID: src.ID, Identity: src.Identity},
		L7:     &flowpb.Layer7{Type: flowpb.L7FlowType_RESPONSE, Record: &flowpb.Layer7_Dns{Dns: &flowpb.DNS{Query: "world.example."}}}}
}

// TestPublishL7Completes: a proxy's flow gets what a decoded flow has
// (node, UUID, time, both endpoints as the node knows them), reaches the
// consumers and the ring, and matches the `--type l7` filter.
func TestPublishL7Completes(t *testing.T) {
	var consumed []*flowpb.Flow
	o := New(Config{Clock: fixedClock, Consumers: []func(*flowpb.Flow){func(f *flowpb.Flow) { consumed = append(consumed, f) }}}, fakeNode{}, nil)
	before := time.Now()
	// By the endpoint ID the proxy named; the destination by address.
	o.PublishL7(dnsFlow(web, "127.0.0.1", dbIP.String()))
	// No endpoint ID: the source by address.
	o.PublishL7(dnsFlow(Endpoint{}, dbIP.String(), worldA.String()))
	o.PublishL7(nil)
	if len(consumed) != 2 || o.Ring().Seen() != 2 {
		t.Fatalf("%d consumed, %d in the ring; want 2", len(consumed), o.Ring().Seen())
	}
	f := consumed[0]
	if f.GetNodeName() != "node-a" || f.GetUuid() == "" || f.GetTime().AsTime().Before(before.Truncate(time.Second)) {
		t.Errorf("not completed: node %q uuid %q time %v", f.GetNodeName(), f.GetUuid(), f.GetTime().AsTime())
	}
	if s := f.GetSource(); s.GetPodName() != web.PodName || s.GetNamespace() != web.Namespace || s.GetIdentity() != web.Identity ||
		len(s.GetLabels()) != len(web.Labels) || len(s.GetWorkloads()) != 1 || s.GetWorkloads()[0].GetName() != "web" {
		t.Errorf("source by ID: %v", s)
	}
	if d := f.GetDestination(); d.GetPodName() != db.PodName || d.GetIdentity() != db.Identity {
		t.Errorf("destination by address: %v", d)
	}
	g := consumed[1]
	if s := g.GetSource(); s.GetPodName() != db.PodName || s.GetID() != db.ID {
		t.Errorf("source by address: %v", s)
	}
	if d := g.GetDestination(); d.GetPodName() != "" || d.GetIdentity() != 0 {
		t.Errorf("unknown destination named: %v", d)
	}
	// Beside a datapath flow, the event type filter hubble's --type l7
	// sends finds the two.
	if err := o.Observe(traceEvent(webIP, dbIP, 6, 40000, 80, 0x02, maps.DirEgress, maps.ReasonForwarded, time.Second)); err != nil {
		t.Fatal(err)
	}
	filters, err := CompileFilters([]*flowpb.FlowFilter{{EventType: []*flowpb.EventTypeFilter{{Type: MessageTypeAccessLog}}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []*flowpb.Flow
	if err := o.Flows(context.Background(), Query{Filters: filters}, func(f *flowpb.Flow) error { got = append(got, f); return nil }, nil); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != consumed[0] || got[1] != consumed[1] {
		t.Fatalf("--type l7: %v", got)
	}
}

// TestPublishL7BesideTheDecoder: the proxies publish from their own
// goroutines while the decoder runs; the consumers still see one flow at
// a time (their contract: the export is not safe for concurrent use) and
// none is lost. Under -race a consumer called concurrently is reported.
func TestPublishL7BesideTheDecoder(t *testing.T) {
	var n int // not synchronised: the observer must call one at a time
	o := New(Config{Capacity: 10000, Clock: fixedClock, Consumers: []func(*flowpb.Flow){func(*flowpb.Flow) { n++ }}}, fakeNode{}, nil)
	const each = 500
	var wg sync.WaitGroup
	wg.Add(3)
	go func() {
		defer wg.Done()
		for i := 0; i < each; i++ {
			_ = o.Observe(traceEvent(webIP, dbIP, 6, 40000, 80, 0x02, maps.DirEgress, maps.ReasonForwarded, time.Second))
		}
	}()
	for range 2 {
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				o.PublishL7(dnsFlow(web, webIP.String(), dbIP.String()))
			}
		}()
	}
	wg.Wait()
	if n != 3*each || o.Ring().Seen() != 3*each {
		t.Fatalf("consumed %d, ring %d; want %d", n, o.Ring().Seen(), 3*each)
	}
}

// TestPublishL7BoundsWhatAPodSent: an HTTP flow's URL and method, which
// a pod chooses, are kept at most MaxL7Text bytes (cut on a rune
// boundary), so the ring cannot be made to hold megabytes per flow.
func TestPublishL7BoundsWhatAPodSent(t *testing.T) {
	o := New(Config{Clock: fixedClock}, fakeNode{}, nil)
	long := "http://web/" + strings.Repeat("é", 1<<19) // a megabyte
	method := strings.Repeat("X", MaxL7Text+1)
	o.PublishL7(&flowpb.Flow{IP: &flowpb.IP{Source: webIP.String(), Destination: dbIP.String()}, Source: &flowpb.Endpoint{ID: web.ID},
		L7: &flowpb.Layer7{Type: flowpb.L7FlowType_RESPONSE, Record: &flowpb.Layer7_Http{Http: &flowpb.HTTP{Url: long, Method: method, Code: 403}}}})
	o.PublishL7(&flowpb.Flow{L7: &flowpb.Layer7{Record: &flowpb.Layer7_Http{Http: &flowpb.HTTP{Url: "http://web/healthz", Method: "GET"}}}})
	f, ok := o.Ring().At(0)
	if !ok {
		t.Fatal("not in the ring")
	}
	h := f.GetL7().GetHttp()
	if len(h.GetUrl()) > MaxL7Text || !strings.HasPrefix(h.GetUrl(), "http://web/é") || !strings.HasSuffix(h.GetUrl(), "...") || !utf8.ValidString(h.GetUrl()) {
		t.Errorf("URL kept: %d bytes, valid UTF-8 %v", len(h.GetUrl()), utf8.ValidString(h.GetUrl()))
	}
	if len(h.GetMethod()) > MaxL7Text {
		t.Errorf("method kept: %d bytes", len(h.GetMethod()))
	}
	if g, _ := o.Ring().At(1); g.GetL7().GetHttp().GetUrl() != "http://web/healthz" || g.GetL7().GetHttp().GetMethod() != "GET" {
		t.Errorf("a short request changed: %v", g.GetL7())
	}
}
