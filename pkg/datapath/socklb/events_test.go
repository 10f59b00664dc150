package socklb

import (
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

// TestPrivilegedSocketLBTranslationEvents: with trace events on, each
// connection translated at connect (TCP, connected UDP) is reported once
// (the frontend asked for, the backend chosen, the service's reverse NAT
// ID); datagrams of unconnected UDP sockets are not; with events off
// nothing is.
func TestPrivilegedSocketLBTranslationEvents(t *testing.T) {
	for _, on := range []bool{true, false} {
		e := setupWith(t, on)
		e.service(t, tcp("10.96.0.10", 80), maps.Service{ID: 1, RevNATID: 7}, 1, threeBackends()...)
		e.service(t, udp("10.96.0.53", 53), maps.Service{ID: 2, RevNATID: 8}, 10, ap("127.0.0.1:9053"))
		res := runHelper(t, e.cgroup, helperRequest{
			TCPServers: threeTCP,
			UDPServers: []helperServer{{"127.0.0.1:9053", "dns"}},
			Probes: []helperProbe{{Kind: "tcp", Dst: "10.96.0.10:80", Count: 3}, {Kind: "udp", Dst: "10.96.0.53:53", Count: 2},
				{Kind: "udp-unconnected", Dst: "10.96.0.53:53", Count: 4}},
		})
		for _, r := range append(append(res[0], res[1]...), res[2]...) {
			checkOK(t, "probe", r)
		}
		rd, err := ringbuf.NewReader(e.events)
		if err != nil {
			t.Fatal(err)
		}
		rd.SetDeadline(time.Now().Add(500 * time.Millisecond))
		var got []loader.Event
		for {
			rec, err := rd.Read()
			if err != nil {
				break
			}
			ev, err := loader.DecodeEvent(rec.RawSample)
			if err != nil {
				t.Fatal(err)
			}
			if ev.Type == loader.EventSockXlate {
				got = append(got, ev)
			}
		}
		rd.Close()
		if !on {
			if len(got) != 0 {
				t.Fatalf("events off: %d socket translation events", len(got))
			}
			continue
		}
		if len(got) != 5 {
			t.Fatalf("%d socket translation events, want one per TCP connection (3) and connected UDP socket (2), none per datagram: %v", len(got), got)
		}
		for _, ev := range got {
			be := netip.AddrPortFrom(ev.Dst, ev.DstPort)
			switch ev.Proto {
			case 6:
				if netip.AddrPortFrom(ev.Src, ev.SrcPort) != ap("10.96.0.10:80") || ev.Cookie != 7 ||
					(be != ap("127.0.0.1:9001") && be != ap("127.0.0.1:9002") && be != ap("127.0.0.1:9003")) {
					t.Errorf("event %v: want frontend 10.96.0.10:80 -> a backend, reverse NAT 7", ev)
				}
			case 17:
				if netip.AddrPortFrom(ev.Src, ev.SrcPort) != ap("10.96.0.53:53") || ev.Cookie != 8 || be != ap("127.0.0.1:9053") {
					t.Errorf("event %v: want frontend 10.96.0.53:53 -> 127.0.0.1:9053, reverse NAT 8", ev)
				}
			default:
				t.Errorf("event %v: protocol", ev)
			}
		}
	}
}
