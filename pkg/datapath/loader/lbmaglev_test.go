package loader

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/loadbalancer/maglev"
)

// TestPrivilegedServiceMaglevRemovalThroughDatapath: 10 backends behind a
// Maglev service, 20,000 flows (distinct client ports) through from_pod
// with BPF_PROG_TEST_RUN. One backend is removed the way the reconciler
// does it (a new table over the nine, the backend entry deleted):
//   - established flows (their per-packet flow entries kept) move only if
//     they were on the removed backend;
//   - the same tuples as new flows (entries cleared) follow the new table:
//     besides the removed backend's flows, only the few whose table entry
//     Maglev reassigned move (measured fraction logged; bound 3 %, the
//     table-level measurement of pkg/loadbalancer/maglev being 1.42 % at
//     most for N=10).
func TestPrivilegedServiceMaglevRemovalThroughDatapath(t *testing.T) {
	n := newTestNode(t)
	n.addEndpoints(false, false)
	from, _ := n.l.Programs()
	const nBackends, nFlows = 10, 20000
	var backs []netip.AddrPort
	for i := 1; i <= nBackends; i++ {
		backs = append(backs, netip.MustParseAddrPort(fmt.Sprintf("10.2.1.%d:8080", i)))
	}
	const svcID = 7
	ids := n.lbService(tcpFE("10.96.0.30", 80), maps.Service{ID: svcID, RevNATID: svcID, Flags: maps.SvcFlagMaglev}, 100, backs...)
	lb := n.l.Maps().LB
	setTable := func(idx []int) {
		t.Helper()
		var mb []maglev.Backend
		for _, i := range idx {
			mb = append(mb, maglev.Backend{Key: backs[i].String(), ID: ids[i], Weight: 1})
		}
		table, err := maglev.Table(mb, maglev.DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		if err := lb.MaglevMap().Upsert(svcID, table); err != nil {
			t.Fatal(err)
		}
	}
	all := make([]int, nBackends)
	for i := range all {
		all[i] = i
	}
	setTable(all)
	fe := netip.MustParseAddr("10.96.0.30")
	run := func() []netip.AddrPort {
		t.Helper()
		out := make([]netip.AddrPort, nFlows)
		for i := range out {
			port := uint16(20000 + i)
			verdict, frame := n.runOut(from, n.ifidx, withL4Checksum(packet(podA, fe, l4{proto: 6, sport: port, dport: 80, tcpFlags: 0x02})))
			if verdict != actOK {
				t.Fatalf("flow from port %d: verdict %d", port, verdict)
			}
			_, out[i] = frameTuple(frame)
		}
		return out
	}
	before := run()
	share := map[netip.AddrPort]int{}
	for _, b := range before {
		share[b]++
	}
	if len(share) != nBackends {
		t.Fatalf("flows reached %d backends, want %d: %v", len(share), nBackends, share)
	}

	// Remove backend 3: new table over the others, then its entry goes
	// (the reconciler's order: slots and table first).
	removed := backs[3]
	rest := append(append([]int{}, all[:3]...), all[4:]...)
	setTable(rest)
	var restIDs []uint32
	for _, i := range rest {
		restIDs = append(restIDs, ids[i])
	}
	if err := lb.ApplyService(tcpFE("10.96.0.30", 80), maps.Service{ID: svcID, RevNATID: svcID, Flags: maps.SvcFlagMaglev}, restIDs, nBackends); err != nil {
		t.Fatal(err)
	}
	if err := lb.BackendMap().Delete(ids[3]); err != nil {
		t.Fatal(err)
	}

	established := run()
	movedEstablished := 0
	for i := range before {
		if established[i] == removed {
			t.Fatalf("flow %d still sent to the removed backend", i)
		}
		if before[i] != removed && established[i] != before[i] {
			movedEstablished++
		}
	}
	if movedEstablished != 0 {
		t.Errorf("%d established flows of live backends moved, want 0", movedEstablished)
	}

	flows, err := ebpf.LoadPinnedMap(filepath.Join(n.l.cfg.BPFRoot, "tdr_lb4_flows_v1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer flows.Close()
	var keys [][]byte
	var k, v []byte
	it := flows.Iterate()
	for it.Next(&k, &v) {
		keys = append(keys, append([]byte(nil), k...))
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	for _, key := range keys {
		if err := flows.Delete(key); err != nil {
			t.Fatal(err)
		}
	}
	fresh := run()
	movedOthers := 0
	for i := range before {
		if before[i] != removed && fresh[i] != before[i] {
			movedOthers++
		}
	}
	frac := float64(movedOthers) / nFlows
	t.Logf("removing 1 of %d backends: its share %.2f %% of %d flows; new flows of live backends moved: %d (%.3f %%); established ones moved: %d",
		nBackends, 100*float64(share[removed])/nFlows, nFlows, movedOthers, 100*frac, movedEstablished)
	if frac > 0.03 {
		t.Errorf("%.2f %% of the live backends' flows moved, want at most 3 %%", 100*frac)
	}
}

// TestPrivilegedServiceIPv6MaglevAffinityNoBackend completes the IPv6
// coverage of the per-packet path: a Maglev service's flows follow the Go
// table at the IPv6 tuple's hash, ClientIP affinity keeps one client's
// flows on one backend (its entry keyed by the IPv6 address), and a
// frontend without backends drops with "Service has no backend".
func TestPrivilegedServiceIPv6MaglevAffinityNoBackend(t *testing.T) {
	n := newTestNode(t)
	n.addEndpoints(false, false)
	from, _ := n.l.Programs()
	lb := n.l.Maps().LB
	backs := []netip.AddrPort{netip.MustParseAddrPort("[fd00:2::1]:8080"), netip.MustParseAddrPort("[fd00:2::2]:8080"), netip.MustParseAddrPort("[fd00:2::3]:8080")}
	fe := netip.MustParseAddrPort("[fd00:96::20]:80")
	tcp6 := func(a netip.AddrPort) maps.Frontend {
		return maps.Frontend{Addr: a.Addr(), Port: a.Port(), Proto: maps.ProtoTCP}
	}
	ids := n.lbService(tcp6(fe), maps.Service{ID: 5, RevNATID: 5, Flags: maps.SvcFlagMaglev}, 10, backs...)
	var mb []maglev.Backend
	addr := map[uint32]netip.AddrPort{}
	for i, id := range ids {
		mb = append(mb, maglev.Backend{Key: backs[i].String(), ID: id, Weight: 1})
		addr[id] = backs[i]
	}
	table, err := maglev.Table(mb, maglev.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := lb.MaglevMap().Upsert(5, table); err != nil {
		t.Fatal(err)
	}
	seen := map[netip.AddrPort]bool{}
	for port := uint16(41000); port < 41030; port++ {
		verdict, out := n.runOut(from, n.ifidx, withL4Checksum(packet(podA6, fe.Addr(), l4{proto: 6, sport: port, dport: 80, tcpFlags: 0x02})))
		_, dst := frameTuple(out)
		want := addr[table[maps.LBHashTuple(netip.AddrPortFrom(podA6, port), fe, 6)%maps.LBMaglevTableSize]]
		if verdict != actOK || dst != want {
			t.Errorf("IPv6 flow from port %d: verdict %d to %s, the Maglev table says %s", port, verdict, dst, want)
		}
		checkChecksums(t, "translated IPv6 SYN", out)
		seen[dst] = true
	}
	if len(seen) < 2 {
		t.Errorf("30 IPv6 flows all went to %v", seen)
	}

	aff := netip.MustParseAddrPort("[fd00:96::21]:80")
	n.lbService(tcp6(aff), maps.Service{ID: 6, RevNATID: 6, Flags: maps.SvcFlagAffinity, AffinityTimeout: 60}, 20, backs...)
	var first netip.AddrPort
	for port := uint16(42000); port < 42020; port++ {
		_, out := n.runOut(from, n.ifidx, withL4Checksum(packet(podA6, aff.Addr(), l4{proto: 6, sport: port, dport: 80, tcpFlags: 0x02})))
		_, dst := frameTuple(out)
		if port == 42000 {
			first = dst
		} else if dst != first {
			t.Fatalf("IPv6 flow from port %d went to %s, the first to %s: no affinity", port, dst, first)
		}
	}
	a, ok, err := lb.AffinityMap().Lookup(maps.AffinityKey{Client: podA6, ServiceID: 6})
	if err != nil || !ok || a.BackendID < 20 || a.BackendID > 22 || backs[a.BackendID-20] != first {
		t.Errorf("affinity of %s = %+v, %v, %v; flows went to %s", podA6, a, ok, err, first)
	}

	none := netip.MustParseAddrPort("[fd00:96::22]:53")
	n.lbService(maps.Frontend{Addr: none.Addr(), Port: 53, Proto: maps.ProtoUDP}, maps.Service{ID: 7, RevNATID: 7}, 30)
	before := n.metric(maps.ReasonSvcNoBackend, maps.DirEgress)
	if got := n.fromPod(n.ifidx, withL4Checksum(packet(podA6, none.Addr(), l4{proto: 17, sport: 33000, dport: 53, payload: []byte("q")}))); got != actShot {
		t.Errorf("IPv6 query to a service without backends = %d, want drop", got)
	}
	if n.metric(maps.ReasonSvcNoBackend, maps.DirEgress) != before+1 {
		t.Errorf("%q not counted for the IPv6 drop", maps.ReasonName(maps.ReasonSvcNoBackend))
	}
}
