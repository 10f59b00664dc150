package lbmap

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/loadbalancer"
	"github.com/tendril-net/tendril/pkg/loadbalancer/maglev"
)

func skipsIn(t *testing.T, m *maps.LBMaps) map[string]uint8 {
	t.Helper()
	out := map[string]uint8{}
	if err := m.SkipMap().Iterate(func(k maps.SkipKey, mode uint8) bool {
		out[fmt.Sprintf("%d %s", k.NetnsCookie, k.Frontend)] = mode
		return true
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPrivilegedOpsSkipRedirectFromBackend: a redirected frontend with
// skip clients gets SVC_F_SKIP_BACKEND, the service's own active backends
// in the slots after the redirect's (local_count) and one skip entry per
// client; a client leaving loses its entry; a new Ops restored from the
// maps knows the entries (an update without them deletes them), and the
// prune deletes those of a frontend gone.
func TestPrivilegedOpsSkipRedirectFromBackend(t *testing.T) {
	m := newLBMaps(t)
	srcs := func() map[string]uint8 {
		t.Helper()
		out := map[string]uint8{}
		if err := m.SkipSrcMap().Iterate(func(k maps.SkipSrcKey, mode uint8) bool {
			out[fmt.Sprintf("%s %s", k.Client, k.Frontend)] = mode
			return true
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	ctx := context.Background()
	o := New(m, maglev.DefaultConfig(), quiet())
	if _, err := o.Restore(); err != nil {
		t.Fatal(err)
	}
	dns := fe("10.96.0.10:53", loadbalancer.UDP, act("10.0.0.7:53"))
	dns.Type = loadbalancer.FrontendLocalRedirect
	dns.SkipClients, dns.SkipMode = []uint64{11, 12}, loadbalancer.SkipToOriginal
	dns.SkipAddrs = []netip.Addr{netip.MustParseAddr("10.0.0.7")}
	dns.Original = []loadbalancer.FrontendBackend{act("10.0.1.5:53"), act("10.0.1.6:53"),
		{Backend: &loadbalancer.Backend{Addr: netip.MustParseAddrPort("10.0.1.9:53")}, Terminating: true}}
	addr := fe("169.254.20.10:53", loadbalancer.UDP, act("10.0.0.7:53"))
	addr.Type = loadbalancer.FrontendLocalRedirect
	addr.SkipClients, addr.SkipMode = []uint64{11}, loadbalancer.SkipPass
	addr.SkipAddrs = []netip.Addr{netip.MustParseAddr("10.0.0.7")}
	for _, f := range []*loadbalancer.Frontend{dns, addr} {
		if err := o.Update(ctx, nil, 0, f); err != nil {
			t.Fatal(err)
		}
	}
	s, got := slotsOf(t, m, dns)
	if s.Flags&maps.SvcFlagSkipBackend == 0 || s.Count != 1 || s.LocalCount != 2 || len(got) != 1 || got[0].String() != "10.0.0.7:53" {
		t.Fatalf("dns service %+v, slots %v: want the redirect's one slot and two original ones", s, got)
	}
	orig, err := m.SlotMap().Get(s.ID, int(s.Count)+int(s.LocalCount))
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"10.0.1.5:53", "10.0.1.6:53"} {
		b, _, _ := m.BackendMap().Lookup(orig[1+i])
		if b.AddrPort().String() != want {
			t.Fatalf("original slot %d = %s, want %s", 2+i, b.AddrPort(), want)
		}
	}
	if as, _ := slotsOf(t, m, addr); as.Flags&maps.SvcFlagSkipBackend == 0 || as.LocalCount != 0 {
		t.Fatalf("address service %+v: want the flag and no original slots", as)
	}
	want := map[string]uint8{"11 10.96.0.10:53/17": maps.LBSkipOriginal, "12 10.96.0.10:53/17": maps.LBSkipOriginal, "11 169.254.20.10:53/17": maps.LBSkipPass}
	if got := skipsIn(t, m); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("skip entries %v, want %v", got, want)
	}

	wantSrcs := map[string]uint8{"10.0.0.7 10.96.0.10:53/17": maps.LBSkipOriginal, "10.0.0.7 169.254.20.10:53/17": maps.LBSkipPass}
	if got := srcs(); fmt.Sprint(got) != fmt.Sprint(wantSrcs) {
		t.Fatalf("per-packet skip entries %v, want %v", got, wantSrcs)
	}

	// Client 12 goes.
	dns.SkipClients = []uint64{11}
	if err := o.Update(ctx, nil, 0, dns); err != nil {
		t.Fatal(err)
	}
	delete(want, "12 10.96.0.10:53/17")
	if got := skipsIn(t, m); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after client 12 left: %v, want %v", got, want)
	}

	// A restarted agent: the flag off for dns deletes its entry, and the
	// prune the address frontend's (gone from the table).
	o2 := New(m, maglev.DefaultConfig(), quiet())
	if _, err := o2.Restore(); err != nil {
		t.Fatal(err)
	}
	plain := fe("10.96.0.10:53", loadbalancer.UDP, act("10.0.0.7:53"))
	plain.Type = loadbalancer.FrontendLocalRedirect
	if err := o2.Update(ctx, nil, 0, plain); err != nil {
		t.Fatal(err)
	}
	if got := skipsIn(t, m); len(got) != 1 || got["11 169.254.20.10:53/17"] != maps.LBSkipPass {
		t.Fatalf("after the flag went: %v", got)
	}
	if got := srcs(); len(got) != 1 || got["10.0.0.7 169.254.20.10:53/17"] != maps.LBSkipPass {
		t.Fatalf("per-packet, after the flag went: %v", got)
	}
	if s, _ := slotsOf(t, m, plain); s.Flags&maps.SvcFlagSkipBackend != 0 || s.LocalCount != 0 {
		t.Fatalf("flag off: service %+v", s)
	}
	live := func(yield func(*loadbalancer.Frontend, uint64) bool) { yield(plain, 0) }
	if err := o2.Prune(ctx, nil, live); err != nil {
		t.Fatal(err)
	}
	if got := skipsIn(t, m); len(got) != 0 {
		t.Fatalf("after the prune: %v", got)
	}
	if got := srcs(); len(got) != 0 {
		t.Fatalf("per-packet, after the prune: %v", got)
	}
}
