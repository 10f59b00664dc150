package ipcache

import (
	"net/netip"
	"slices"
	"testing"
)

// TestTrackWithdrawnRemote: an address whose effective claim was another
// node's is recorded when that claim goes, or another owner or identity
// takes the address over; a local endpoint's claim, a CIDR, an unchanged
// resync and an untracked cache record nothing.
func TestTrackWithdrawnRemote(t *testing.T) {
	b := &fakeBackend{m: map[netip.Prefix]Entry{}, fail: map[netip.Prefix]bool{}}
	c := startCache(t, b)
	a, bAddr, cAddr := netip.MustParsePrefix("10.1.0.5/32"), netip.MustParsePrefix("10.1.0.6/32"), netip.MustParsePrefix("10.1.0.7/32")
	remoteA, remoteB := OwnerTendrilEndpoint("ns", "a"), OwnerTendrilEndpoint("ns", "b")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// Not tracked yet: nothing is kept.
	must(c.Upsert(a, Entry{Identity: 1000, Source: SourceKubernetes, Owner: remoteA}))
	must(c.Delete(a, SourceKubernetes, remoteA))
	c.TrackWithdrawnRemote()
	if got := c.TakeWithdrawnRemote(); got != nil {
		t.Fatalf("before tracking: %v", got)
	}

	must(c.Upsert(a, Entry{Identity: 1000, Source: SourceKubernetes, Owner: remoteA}))
	must(c.Upsert(a, Entry{Identity: 1000, Source: SourceKubernetes, Owner: remoteA})) // resync
	must(c.Upsert(bAddr, Entry{Identity: 1001, Source: SourceKVStore, Owner: OwnerKVStore("k")}))
	must(c.Upsert(cAddr, Entry{Identity: 1002, Source: SourceLocal, Owner: OwnerEndpoint(3)}))
	must(c.Upsert(netip.MustParsePrefix("10.2.0.0/24"), Entry{Identity: 1003, Source: SourceKubernetes, Owner: remoteA}))
	if got := c.TakeWithdrawnRemote(); got != nil {
		t.Fatalf("creations and a resync recorded %v", got)
	}
	// Another pod takes a's address (its claim is the newer one), b's
	// identity changes, the local endpoint and the CIDR go.
	must(c.Upsert(a, Entry{Identity: 1004, Source: SourceKubernetes, Owner: remoteB}))
	must(c.Upsert(bAddr, Entry{Identity: 1005, Source: SourceKVStore, Owner: OwnerKVStore("k")}))
	must(c.Delete(cAddr, SourceLocal, OwnerEndpoint(3)))
	must(c.Delete(netip.MustParsePrefix("10.2.0.0/24"), SourceKubernetes, remoteA))
	got := c.TakeWithdrawnRemote()
	slices.SortFunc(got, netip.Addr.Compare)
	if want := []netip.Addr{a.Addr(), bAddr.Addr()}; !slices.Equal(got, want) {
		t.Fatalf("withdrawn %v, want %v", got, want)
	}
	// The last claim goes: recorded once; taken, forgotten.
	must(c.Delete(a, SourceKubernetes, remoteA))
	must(c.Delete(a, SourceKubernetes, remoteB))
	if got := c.TakeWithdrawnRemote(); !slices.Equal(got, []netip.Addr{a.Addr()}) {
		t.Fatalf("after the last claim went: %v", got)
	}
	if got := c.TakeWithdrawnRemote(); got != nil {
		t.Fatalf("taken twice: %v", got)
	}
}
