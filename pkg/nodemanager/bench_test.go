package nodemanager

import (
	"fmt"
	"net/netip"
	"testing"
	"time"
)

// benchPeers are n peers as a cluster has them: one address each in the
// node subnet, one /24 each from 10.128.0.0/9, created a second apart.
func benchPeers(n int) []Peer {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	out := make([]Peer, n)
	for i := range out {
		out[i] = Peer{Name: fmt.Sprintf("node-%05d", i), Created: t0.Add(time.Duration(i) * time.Second),
			IPs:      []netip.Addr{netip.AddrFrom4([4]byte{172, 16 + byte(i>>16), byte(i >> 8), byte(i)})},
			PodCIDRs: []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 128 + byte(i>>8), byte(i), 0}), 24)}}
	}
	return out
}

// BenchmarkUpsertPeer1000: a change of one node's address in a table of
// 1,000 nodes (each iteration moves node 500 between two addresses), the
// cost every node event pays at that size.
func BenchmarkUpsertPeer1000(b *testing.B) {
	m, _ := startManager(b, &fakeRoutes{routes: map[netip.Prefix]netip.Addr{}}, newFakeCache())
	peers := benchPeers(1000)
	for _, p := range peers {
		if err := m.UpsertPeer(p); err != nil {
			b.Fatal(err)
		}
	}
	p, alt := peers[500], netip.MustParseAddr("172.31.255.1")
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		q := p
		if i%2 == 0 {
			q.IPs = []netip.Addr{alt}
		}
		if err := m.UpsertPeer(q); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFillPeers1000: 1,000 nodes upserted into an empty table, as
// at an agent's start in a 1,000-node cluster.
func BenchmarkFillPeers1000(b *testing.B) {
	peers := benchPeers(1000)
	for b.Loop() {
		b.StopTimer()
		m, _ := startManager(b, nil, nil)
		b.StartTimer()
		for _, p := range peers {
			if err := m.UpsertPeer(p); err != nil {
				b.Fatal(err)
			}
		}
	}
}
