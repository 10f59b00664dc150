package loader

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

// testdata/lxc_v3_bpfel.o is the datapath object of the layout before the
// reverse NAT ID was widened (as committed up to 80ec418): conntrack in
// tdr_ct4_v1/tdr_ct6_v1 with a 16-bit reverse NAT ID, LB maps of 65,536
// frontends, backends and reverse NAT entries and 262,144 slots. Its other
// maps have today's layout, so the maps package writes them.

// startLayout3Datapath runs the v3 datapath as its agent left it: maps and
// links pinned under the lab's root, endpoints and their identities
// written, the service in the LB maps, the process's handles closed.
func startLayout3Datapath(t *testing.T, lab *podLab, eps []EndpointInfo, write func(*maps.LBMaps)) {
	t.Helper()
	spec, err := ebpf.LoadCollectionSpec("testdata/lxc_v3_bpfel.o")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(lab.root, "links"), 0o750); err != nil {
		t.Fatal(err)
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: lab.root}})
	if err != nil {
		t.Fatal(err)
	}
	defer coll.Close()
	old := &maps.Maps{Endpoints: coll.Maps[maps.EndpointsMapName], EndpointsIfx: coll.Maps[maps.EndpointIfxName],
		EndpointsID: coll.Maps[maps.EndpointIDName], EndpointsIP4: coll.Maps[maps.EndpointIP4Name],
		EndpointsIP6: coll.Maps[maps.EndpointIP6Name], IPCache: coll.Maps[maps.IPCacheMapName]}
	for _, ep := range eps {
		e := maps.Endpoint{ID: ep.ID, IfIndex: uint32(ep.IfIndex), Identity: ep.Identity, Flags: maps.FlagDeliverDirect,
			MAC: ep.MAC, HostMAC: ep.HostMAC, IPv4: ep.Addresses[0], IPv6: ep.Addresses[1]}
		if err := old.EndpointMap().Upsert(e); err != nil {
			t.Fatal(err)
		}
		for _, ip := range ep.Addresses {
			if err := old.IPCacheMap().Upsert(netip.PrefixFrom(ip, ip.BitLen()), maps.IPCacheEntry{Identity: ep.Identity}); err != nil {
				t.Fatal(err)
			}
		}
	}
	lb := &maps.LBMaps{Services4: coll.Maps[maps.LB4ServicesMapName], Services6: coll.Maps[maps.LB6ServicesMapName],
		Slots: coll.Maps[maps.LBSlotsMapName], Backends: coll.Maps[maps.LBBackendsMapName], RevNAT: coll.Maps[maps.LBRevNATMapName],
		Affinity: coll.Maps[maps.LBAffinityMapName], Maglev: coll.Maps[maps.LBMaglevMapName], SockRevNAT: coll.Maps[maps.LBSockRevNATMapName]}
	if lb.Slots.MaxEntries() != 262144 || lb.Services4.MaxEntries() != 65536 {
		t.Fatalf("layout 3's LB maps: %d slots, %d services", lb.Slots.MaxEntries(), lb.Services4.MaxEntries())
	}
	write(lb)
	for _, ep := range eps {
		for dir, prog := range map[string]*ebpf.Program{"ingress": coll.Programs["from_pod"], "egress": coll.Programs["to_pod"]} {
			attach := ebpf.AttachTCXIngress
			if dir == "egress" {
				attach = ebpf.AttachTCXEgress
			}
			lk, err := link.AttachTCX(link.TCXOptions{Interface: ep.IfIndex, Program: prog, Attach: attach})
			if err != nil {
				t.Fatal(err)
			}
			if err := lk.Pin(filepath.Join(lab.root, "links", linkName(ep.ID, dir))); err != nil {
				t.Fatal(err)
			}
			lk.Close()
		}
	}
}

// echoStream is a TCP connection through a service that exchanges a
// message every 5 ms until stopped, counting round trips; any error ends
// it and is kept.
type echoStream struct {
	mu    sync.Mutex
	trips int
	err   error
	stop  chan struct{}
	done  chan struct{}
}

func (s *echoStream) count() (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.trips, s.err
}

func startEchoStream(conn net.Conn) *echoStream {
	s := &echoStream{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		defer conn.Close()
		msg, back := make([]byte, 64), make([]byte, 64)
		for i := 0; ; i++ {
			select {
			case <-s.stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			for j := range msg {
				msg[j] = byte(i + j)
			}
			// Bounds a broken path only: a round trip takes well under
			// a millisecond.
			_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
			_, err := conn.Write(msg)
			if err == nil {
				_, err = io.ReadFull(conn, back)
			}
			if err == nil && string(back) != string(msg) {
				err = fmt.Errorf("round trip %d: echo differs", i)
			}
			s.mu.Lock()
			if err != nil {
				s.err = fmt.Errorf("round trip %d: %w", i, err)
				s.mu.Unlock()
				return
			}
			s.trips++
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *echoStream) waitTrips(t *testing.T, n int) {
	t.Helper()
	for i := 0; ; i++ {
		trips, err := s.count()
		if err != nil {
			t.Fatalf("stream through the service: %v", err)
		}
		if trips >= n {
			return
		}
		// Bounds a stalled stream only.
		if i == 2000 {
			t.Fatalf("stream through the service made %d round trips, want %d", trips, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestPrivilegedUpgradeServicesFromLayout3: the agent starts over a running
// datapath of layout 3 (16-bit reverse NAT IDs in conntrack, LB maps of
// 65,536 entries and 262,144 slots) while a pod's TCP connection streams
// through a ClusterIP translated per packet. The new loader carries the
// LB maps over into maps of the new capacity (same names, every entry and
// ID) and the conntrack entries into the wider layout; the pinned links
// switch. The stream continues without an error (its replies keep the
// frontend as source: the flow's reverse NAT ID came along), a new
// connection through the service works, and every ID is unchanged.
func TestPrivilegedUpgradeServicesFromLayout3(t *testing.T) {
	lab := newPodLab(t)
	client, backend := lab.addPod("a", 0), lab.addPod("b", 1)
	eps := []EndpointInfo{client.endpoint(1, 4001, false), backend.endpoint(2, 4002, false)}
	fe := maps.Frontend{Addr: netip.MustParseAddr("10.96.7.7"), Port: 80, Proto: maps.ProtoTCP}
	svc := maps.Service{ID: 700, RevNATID: 701, Count: 1}
	const backendID = 705
	be := maps.Backend{Addr: backend.IPv4, Port: 8080, State: maps.BackendStateActive}
	startLayout3Datapath(t, lab, eps, func(lb *maps.LBMaps) {
		if err := lb.BackendMap().Upsert(backendID, be); err != nil {
			t.Fatal(err)
		}
		if err := lb.RevNATMap().Upsert(svc.RevNATID, netip.AddrPortFrom(fe.Addr, fe.Port)); err != nil {
			t.Fatal(err)
		}
		if err := lb.ApplyService(fe, svc, []uint32{backendID}, 0); err != nil {
			t.Fatal(err)
		}
	})

	var ln net.Listener
	if err := backend.Do(func() (err error) {
		ln, err = net.Listen("tcp", netip.AddrPortFrom(backend.IPv4, 8080).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peers := make(chan net.Addr, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			peers <- c.RemoteAddr()
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	dial := func() net.Conn {
		t.Helper()
		var conn net.Conn
		if err := client.Do(func() (err error) {
			conn, err = net.DialTimeout("tcp", netip.AddrPortFrom(fe.Addr, fe.Port).String(), 2*time.Second)
			return err
		}); err != nil {
			t.Fatalf("connect to the ClusterIP: %v", err)
		}
		if got := (<-peers).(*net.TCPAddr).AddrPort().Addr(); got != client.IPv4 {
			t.Fatalf("backend saw %s, want the client %s", got, client.IPv4)
		}
		return conn
	}
	stream := startEchoStream(dial())
	defer func() { close(stream.stop); <-stream.done }()
	stream.waitTrips(t, 50)

	l := lab.loader()
	for _, name := range []string{maps.CT4V1MapName, maps.CT6V1MapName} {
		if _, err := os.Stat(filepath.Join(lab.root, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("pin of the old layout %s still there (%v)", name, err)
		}
	}
	lb := l.Maps().LB
	if lb.Services4.MaxEntries() != maps.LBMapMax || lb.Slots.MaxEntries() != maps.LBSlotsMapMax || lb.Backends.MaxEntries() != maps.LBMapMax {
		t.Errorf("LB maps not resized: services %d, slots %d, backends %d", lb.Services4.MaxEntries(), lb.Slots.MaxEntries(), lb.Backends.MaxEntries())
	}
	if got, ok, err := lb.ServiceMap().Lookup(fe); err != nil || !ok || got != svc {
		t.Errorf("service carried over as %+v (found %v, %v), want %+v", got, ok, err, svc)
	}
	if ids, err := lb.SlotMap().Get(svc.ID, 1); err != nil || len(ids) != 1 || ids[0] != backendID {
		t.Errorf("slots carried over as %v (%v)", ids, err)
	}
	if got, ok, err := lb.BackendMap().Lookup(backendID); err != nil || !ok || got.AddrPort() != be.AddrPort() {
		t.Errorf("backend carried over as %+v (found %v, %v)", got, ok, err)
	}
	if got, ok, err := lb.RevNATMap().Lookup(svc.RevNATID); err != nil || !ok || got != netip.AddrPortFrom(fe.Addr, fe.Port) {
		t.Errorf("reverse NAT carried over as %s (found %v, %v)", got, ok, err)
	}
	ct, err := l.Maps().CTMap().List()
	if err != nil {
		t.Fatal(err)
	}
	var translated []maps.CTEntry
	for _, e := range ct {
		if e.Proto == maps.ProtoTCP && e.Src == client.IPv4 && e.Dst == backend.IPv4 && e.DstPort == 8080 {
			translated = append(translated, e)
		}
	}
	if len(translated) != 1 || translated[0].RevNAT != svc.RevNATID || translated[0].SrcEndpoint != 1 || translated[0].DstEndpoint != 2 {
		t.Errorf("the stream's conntrack entry carried over as %+v, want one with reverse NAT %d", translated, svc.RevNATID)
	}

	// Through the new programs, before and after the agent regenerates
	// its endpoints.
	trips, _ := stream.count()
	stream.waitTrips(t, trips+50)
	for _, ep := range eps {
		if err := l.AttachEndpoint(ep); err != nil {
			t.Fatal(err)
		}
	}
	trips, _ = stream.count()
	stream.waitTrips(t, trips+50)
	second := startEchoStream(dial())
	second.waitTrips(t, 20)
	close(second.stop)
	<-second.done
	if _, err := second.count(); err != nil {
		t.Errorf("new connection after the upgrade: %v", err)
	}
	trips, err = stream.count()
	t.Logf("stream across the upgrade: %d round trips", trips)
	if err != nil {
		t.Errorf("stream across the upgrade: %v", err)
	}
}
