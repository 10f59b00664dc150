package loader

import (
	"errors"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

const (
	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpPSH = 0x08
	tcpACK = 0x10
)

// drain reads every event the ring buffer holds now (it waits up to
// quiet for the next one).
func drain(t *testing.T, er *EventReader, quiet time.Duration) []Event {
	t.Helper()
	var out []Event
	for {
		er.SetDeadline(time.Now().Add(quiet))
		ev, err := er.Read()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, ev)
	}
}

// TestPrivilegedTraceEventsPerConnection: with per-connection traces, a
// TCP connection reports its SYN (from the pod), SYN-ACK (to the pod, a
// reply), the first FIN and an RST, with flags, observation point and
// both identities; its data packets report nothing.
func TestPrivilegedTraceEventsPerConnection(t *testing.T) {
	n := newNodeWith(t, Config{DirectDelivery: true, TraceEvents: TracePerConnection})
	n.addEndpoints(true, false)
	er, err := n.l.NewEventReader()
	if err != nil {
		t.Fatal(err)
	}
	defer er.Close()

	out := func(flags uint8) []byte {
		return packet(podA, remote, l4{proto: 6, sport: 40000, dport: 80, tcpFlags: flags})
	}
	in := func(flags uint8) []byte {
		return packet(remote, podA, l4{proto: 6, sport: 80, dport: 40000, tcpFlags: flags})
	}
	steps := []struct {
		pkt   []byte
		from  bool
		trace bool
	}{
		{out(tcpSYN), true, true},
		{in(tcpSYN | tcpACK), false, true},
		{out(tcpACK), true, false},
		{out(tcpACK | tcpPSH), true, false},
		{in(tcpACK | tcpPSH), false, false},
		{out(tcpACK | tcpPSH), true, false},
		{in(tcpACK), false, false},
		{out(tcpFIN | tcpACK), true, true},
		{in(tcpFIN | tcpACK), false, false},
		{in(tcpRST), false, true},
	}
	var want []Event
	for i, s := range steps {
		var got uint32
		if s.from {
			got = n.fromPod(n.ifidx, s.pkt)
		} else {
			got = n.toPod(n.ifidx, s.pkt)
		}
		if got != actOK {
			t.Fatalf("step %d: verdict %d", i, got)
		}
		if s.trace {
			want = append(want, Event{Direction: map[bool]uint8{true: maps.DirEgress, false: maps.DirIngress}[s.from], TCPFlags: s.pkt[14+20+13]})
		}
	}
	evs := drain(t, er, 300*time.Millisecond)
	if len(evs) != len(want) {
		t.Fatalf("%d events, want %d: %v", len(evs), len(want), evs)
	}
	for i, ev := range evs {
		if ev.Type != EventTrace || ev.Direction != want[i].Direction || ev.TCPFlags != want[i].TCPFlags || ev.EndpointID != 1 {
			t.Errorf("event %d: %v flags %#x, want trace dir %d flags %#x", i, ev, ev.TCPFlags, want[i].Direction, want[i].TCPFlags)
		}
		wantObs := maps.ObsFromEndpoint
		src, dst, sid, did := podA, remote, uint32(idA), uint32(idRemote)
		if ev.Direction == maps.DirIngress {
			wantObs, src, dst, sid, did = maps.ObsToEndpoint, remote, podA, idRemote, idA
		}
		if ev.ObsPoint != wantObs || ev.Src != src || ev.Dst != dst || ev.SrcIdentity != sid || ev.DstIdentity != did || ev.Proto != 6 {
			t.Errorf("event %d: %+v, want obs %d %s(%d) -> %s(%d)", i, ev, wantObs, src, sid, dst, did)
		}
	}
	// The first is the new flow, the second its first reply.
	if len(evs) >= 2 && (evs[0].Reason != maps.ReasonForwarded || evs[1].Reason != maps.ReasonCTReply) {
		t.Errorf("reasons %s, %s: want new flow then reply", maps.ReasonName(evs[0].Reason), maps.ReasonName(evs[1].Reason))
	}

	// A UDP flow: its first packet and first reply only.
	for i := 0; i < 5; i++ {
		n.fromPod(n.ifidx, packet(podA, remote, l4{proto: 17, sport: 5000, dport: 53}))
	}
	n.allow(1, maps.DirIngress, idRemote, 17, 0)
	for i := 0; i < 5; i++ {
		n.toPod(n.ifidx, packet(remote, podA, l4{proto: 17, sport: 53, dport: 5000}))
	}
	evs = drain(t, er, 300*time.Millisecond)
	if len(evs) != 2 || evs[0].Reason != maps.ReasonForwarded || evs[1].Reason != maps.ReasonCTReply || evs[0].TCPFlags != 0 {
		t.Fatalf("UDP flow: %v, want its first packet and first reply", evs)
	}
}

// TestPrivilegedTraceEventsOffAndEveryPacket: off, a forwarded packet
// reports nothing; every-packet reports each one.
func TestPrivilegedTraceEventsOffAndEveryPacket(t *testing.T) {
	for _, mode := range []TraceMode{TraceOff, TraceEveryPacket} {
		t.Run(map[TraceMode]string{TraceOff: "off", TraceEveryPacket: "every-packet"}[mode], func(t *testing.T) {
			n := newNodeWith(t, Config{DirectDelivery: true, TraceEvents: mode})
			n.addEndpoints(true, false)
			er, err := n.l.NewEventReader()
			if err != nil {
				t.Fatal(err)
			}
			defer er.Close()
			const pkts = 20
			for i := 0; i < pkts; i++ {
				n.fromPod(n.ifidx, packet(podA, remote, l4{proto: 6, sport: 40000, dport: 80, tcpFlags: tcpACK}))
			}
			want := 0
			if mode == TraceEveryPacket {
				want = pkts
			}
			if evs := drain(t, er, 200*time.Millisecond); len(evs) != want {
				t.Fatalf("%d events, want %d", len(evs), want)
			}
		})
	}
	if err := TraceMode("sometimes").set(nil); err == nil {
		t.Fatal("an unknown trace mode was accepted")
	}
}

// TestPrivilegedEventsLostCounted: past the per-CPU event rate, events are
// not written but counted: every packet is either an event read or a lost
// event counted.
func TestPrivilegedEventsLostCounted(t *testing.T) {
	n := newNodeWith(t, Config{DirectDelivery: true, TraceEvents: TraceEveryPacket})
	n.addEndpoints(true, false)
	er, err := n.l.NewEventReader()
	if err != nil {
		t.Fatal(err)
	}
	defer er.Close()
	const pkts = 3000 // the burst is 1000 events per CPU
	for i := 0; i < pkts; i++ {
		n.fromPod(n.ifidx, packet(podA, remote, l4{proto: 17, sport: 5000, dport: 53}))
	}
	read := len(drain(t, er, 300*time.Millisecond))
	lost, err := n.l.EventsLost()
	if err != nil {
		t.Fatal(err)
	}
	if lost.RateLimited == 0 || uint64(read)+lost.Total() != pkts {
		t.Fatalf("read %d, lost %+v: want some rate limited and %d in all", read, lost, pkts)
	}
}

// TestPrivilegedVerdictMatchType: a policy verdict event carries the match
// type of the entry that allowed the flow: L3-only (identity, any port),
// L3-L4 (identity and port), L4-only (any identity, a port), all.
func TestPrivilegedVerdictMatchType(t *testing.T) {
	n := newNodeWith(t, Config{DirectDelivery: true, PolicyVerdictEvents: true})
	n.addEndpoints(true, false)
	er, err := n.l.NewEventReader()
	if err != nil {
		t.Fatal(err)
	}
	defer er.Close()
	// Each case allows port 80 from the remote peer with one kind of
	// entry (replacing the previous one) and sends a new flow.
	cases := []struct {
		name      string
		id        uint32
		proto     uint8
		port      uint16
		wantMatch uint8
	}{
		{"L3-only", idRemote, 0, 0, maps.PolicyMatchL3Only},
		{"L3-L4", idRemote, 6, 80, maps.PolicyMatchL3L4},
		{"L4-only", 0, 6, 80, maps.PolicyMatchL4Only},
		{"all", 0, 0, 0, maps.PolicyMatchAll},
	}
	var prev *maps.PolicyKey
	for i, c := range cases {
		if prev != nil {
			if err := n.l.Maps().PolicyMap().Delete(*prev); err != nil {
				t.Fatal(err)
			}
		}
		n.allow(1, maps.DirIngress, c.id, c.proto, c.port)
		k := maps.PolicyKey{EndpointID: 1, Direction: maps.DirIngress, Identity: c.id, Proto: c.proto, Port: c.port}
		if c.port != 0 {
			k.PortPrefixLen = 16
		}
		prev = &k
		if got := n.toPod(n.ifidx, packet(remote, podA, l4{proto: 6, sport: uint16(50000 + i), dport: 80, tcpFlags: tcpSYN})); got != actOK {
			t.Fatalf("%s: verdict %d", c.name, got)
		}
		evs := drain(t, er, 200*time.Millisecond)
		if len(evs) != 1 || evs[0].Type != EventPolicyVerdict || evs[0].Cookie != 7 || evs[0].MatchType != c.wantMatch {
			t.Fatalf("%s: events %+v, want one verdict with match type %d", c.name, evs, c.wantMatch)
		}
	}
	// Drops and traces carry none.
	n.l.Maps().PolicyMap().Delete(*prev)
	n.toPod(n.ifidx, packet(remote, podA, l4{proto: 6, sport: 60000, dport: 80, tcpFlags: tcpSYN}))
	if evs := drain(t, er, 200*time.Millisecond); len(evs) != 1 || evs[0].Type != EventDrop || evs[0].MatchType != 0 {
		t.Fatalf("drop: %+v", evs)
	}
}

// TestPrivilegedDirectDeliveryToEndpointTrace: between two local pods
// with direct delivery, the receiver's to_pod does not run; the sender's
// from_pod reports the receiver's to-endpoint trace too (its endpoint ID,
// ingress), for the SYN and for the SYN-ACK coming back.
func TestPrivilegedDirectDeliveryToEndpointTrace(t *testing.T) {
	n := newNodeWith(t, Config{DirectDelivery: true, TraceEvents: TracePerConnection})
	n.addDirectEndpoints()
	n.allow(2, maps.DirIngress, idA, 6, 8080)
	er, err := n.l.NewEventReader()
	if err != nil {
		t.Fatal(err)
	}
	defer er.Close()
	if got := n.fromPod(n.ifidx, packet(podA, podB, l4{proto: 6, sport: 40000, dport: 8080, tcpFlags: tcpSYN})); got != actRedirect {
		t.Fatalf("SYN A to B = %d, want redirect", got)
	}
	if got := n.fromPod(n.ifidx2, packet(podB, podA, l4{proto: 6, sport: 8080, dport: 40000, tcpFlags: tcpSYN | tcpACK})); got != actRedirect {
		t.Fatalf("SYN-ACK B to A = %d, want redirect", got)
	}
	// Data: nothing.
	n.fromPod(n.ifidx, packet(podA, podB, l4{proto: 6, sport: 40000, dport: 8080, tcpFlags: tcpACK}))
	evs := drain(t, er, 300*time.Millisecond)
	type seen struct {
		ep    uint16
		obs   uint8
		flags uint8
		src   netip.Addr
	}
	want := []seen{
		{1, maps.ObsFromEndpoint, tcpSYN, podA},
		{2, maps.ObsToEndpoint, tcpSYN, podA},
		{2, maps.ObsFromEndpoint, tcpSYN | tcpACK, podB},
		{1, maps.ObsToEndpoint, tcpSYN | tcpACK, podB},
	}
	if len(evs) != len(want) {
		t.Fatalf("%d events, want %d: %+v", len(evs), len(want), evs)
	}
	for i, ev := range evs {
		got := seen{ev.EndpointID, ev.ObsPoint, ev.TCPFlags, ev.Src}
		if got != want[i] || ev.Type != EventTrace || ev.SrcIdentity == 0 || ev.DstIdentity == 0 {
			t.Errorf("event %d: %+v, want %+v", i, ev, want[i])
		}
	}
}
