package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"
)

func mustNew(t testing.TB, v4, v6 string) *IPAM {
	t.Helper()
	var p4, p6 netip.Prefix
	if v4 != "" {
		p4 = netip.MustParsePrefix(v4)
	}
	if v6 != "" {
		p6 = netip.MustParsePrefix(v6)
	}
	m, err := New(DefaultConfig(), nil, p4, p6)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestDualStackAllocation(t *testing.T) {
	m := mustNew(t, "10.1.0.0/24", "fd00:1::/112")
	if got := m.RouterIP(IPv4); got != netip.MustParseAddr("10.1.0.1") {
		t.Fatalf("router v4 = %s", got)
	}
	if got := m.RouterIP(IPv6); got != netip.MustParseAddr("fd00:1::1") {
		t.Fatalf("router v6 = %s", got)
	}
	a4, err := m.AllocateNext(IPv4, "ns/a")
	if err != nil || a4.IP != netip.MustParseAddr("10.1.0.2") {
		t.Fatalf("v4 = %+v, %v", a4, err)
	}
	a6, err := m.AllocateNext(IPv6, "ns/a")
	if err != nil || a6.IP != netip.MustParseAddr("fd00:1::2") {
		t.Fatalf("v6 = %+v, %v", a6, err)
	}
	// Same owner, same address while no endpoint claimed it.
	again, _ := m.AllocateNext(IPv4, "ns/a")
	if again.IP != a4.IP {
		t.Fatalf("owner got %s then %s", a4.IP, again.IP)
	}
	// Once claimed, the owner's next request (a pod re-created before the
	// old sandbox is gone) gets a new address: never two endpoints on one.
	if err := m.Claim(a4.IP, ""); err != nil {
		t.Fatal(err)
	}
	fresh, _ := m.AllocateNext(IPv4, "ns/a")
	if fresh.IP == a4.IP {
		t.Fatalf("claimed address %s handed out again", a4.IP)
	}
	b4, _ := m.AllocateNext(IPv4, "ns/b")
	if b4.IP == a4.IP {
		t.Fatal("two owners share an address")
	}
}

func TestSpecificAllocationErrors(t *testing.T) {
	m := mustNew(t, "10.1.0.0/24", "")
	tests := []struct {
		ip, owner string
		want      error
	}{
		{"10.1.0.10", "x/1", nil},
		{"10.1.0.10", "x/1", nil}, // same owner again
		{"10.1.0.10", "x/2", ErrAlreadyAllocated},
		{"10.2.0.10", "x/3", ErrOutOfRange},
		{"10.1.0.1", "x/4", ErrReserved},
		{"10.1.0.0", "x/5", ErrOutOfRange},
		{"10.1.0.255", "x/6", ErrOutOfRange},
		{"fd00::5", "x/7", ErrFamilyDisabled},
	}
	for _, tt := range tests {
		_, err := m.Allocate(netip.MustParseAddr(tt.ip), tt.owner)
		if !errors.Is(err, tt.want) {
			t.Errorf("Allocate(%s, %s) = %v, want %v", tt.ip, tt.owner, err, tt.want)
		}
	}
	if err := m.Release(netip.MustParseAddr("10.1.0.11")); !errors.Is(err, ErrNotAllocated) {
		t.Fatalf("release unallocated = %v", err)
	}
	if err := m.Release(netip.MustParseAddr("10.1.0.10")); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Allocate(netip.MustParseAddr("10.1.0.10"), "x/2"); err != nil {
		t.Fatalf("reallocate after release: %v", err)
	}
}

func TestExhaustion(t *testing.T) {
	m := mustNew(t, "10.9.0.0/29", "") // 8 addresses: network, router, broadcast, 5 usable
	for i := 0; i < 5; i++ {
		if _, err := m.AllocateNext(IPv4, fmt.Sprintf("p/%d", i)); err != nil {
			t.Fatalf("allocation %d: %v", i, err)
		}
	}
	_, err := m.AllocateNext(IPv4, "p/5")
	if !errors.Is(err, ErrPoolExhausted) {
		t.Fatalf("6th allocation = %v, want exhausted", err)
	}
	if u := m.Usage()[0]; u.Used != 5 || u.Total != 5 {
		t.Fatalf("usage = %+v", u)
	}
	m.ReleaseOwner("p/2")
	a, err := m.AllocateNext(IPv4, "p/6")
	if err != nil || a.IP != netip.MustParseAddr("10.9.0.4") {
		t.Fatalf("after release: %+v %v", a, err)
	}
}

func TestExpiration(t *testing.T) {
	m := mustNew(t, "10.1.0.0/24", "")
	now := time.Unix(1000, 0)
	m.SetClock(func() time.Time { return now })
	claimed, _ := m.AllocateNextWithExpiration(IPv4, "ns/claimed")
	unclaimed, _ := m.AllocateNextWithExpiration(IPv4, "ns/unclaimed")
	if claimed.ExpirationUUID == "" || claimed.ExpirationUUID == unclaimed.ExpirationUUID {
		t.Fatalf("uuids %q %q", claimed.ExpirationUUID, unclaimed.ExpirationUUID)
	}
	if err := m.StopExpiration(claimed.IP, "wrong"); !errors.Is(err, ErrExpirationUUID) {
		t.Fatalf("wrong uuid = %v", err)
	}
	if err := m.StopExpiration(claimed.IP, claimed.ExpirationUUID); err != nil {
		t.Fatal(err)
	}
	now = now.Add(9 * time.Minute)
	if got := m.ReleaseExpired(); len(got) != 0 {
		t.Fatalf("released early: %v", got)
	}
	now = now.Add(2 * time.Minute)
	got := m.ReleaseExpired()
	if len(got) != 1 || got[0].IP != unclaimed.IP {
		t.Fatalf("released %v, want only %s", got, unclaimed.IP)
	}
	if _, ok := m.Lookup(claimed.IP); !ok {
		t.Fatal("claimed address released")
	}
}

func TestRestoreBeforeAllocation(t *testing.T) {
	m := mustNew(t, "10.1.0.0/24", "")
	restored := map[string]string{"10.1.0.2": "a/1", "10.1.0.3": "a/2", "10.1.0.7": "a/3"}
	for ip, owner := range restored {
		if err := m.Restore(netip.MustParseAddr(ip), owner); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Restore(netip.MustParseAddr("10.1.0.7"), "other/x"); !errors.Is(err, ErrAlreadyAllocated) {
		t.Fatalf("double restore = %v", err)
	}
	seen := map[netip.Addr]bool{}
	for i := 0; i < 10; i++ {
		a, err := m.AllocateNext(IPv4, fmt.Sprintf("new/%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := restored[a.IP.String()]; ok || seen[a.IP] {
			t.Fatalf("handed out %s twice", a.IP)
		}
		seen[a.IP] = true
	}
}

func TestConcurrentAllocationsNeverShare(t *testing.T) {
	m := mustNew(t, "10.1.0.0/22", "fd00::/118")
	var wg sync.WaitGroup
	var mu sync.Mutex
	seen := map[netip.Addr]string{}
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100; i++ {
				owner := fmt.Sprintf("g%d/%d", g, i)
				for _, f := range []Family{IPv4, IPv6} {
					a, err := m.AllocateNext(f, owner)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					if prev, ok := seen[a.IP]; ok {
						t.Errorf("%s handed to %s and %s", a.IP, prev, owner)
					}
					seen[a.IP] = owner
					mu.Unlock()
				}
				if i%3 == 0 {
					m.ReleaseOwner(owner)
					mu.Lock()
					for ip, o := range seen {
						if o == owner {
							delete(seen, ip)
						}
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
}

func TestInvalidCIDRs(t *testing.T) {
	tests := []struct{ v4, v6 string }{
		{"", ""},
		{"fd00::/64", ""},
		{"", "10.0.0.0/24"},
		{"10.0.0.0/31", ""},
	}
	for _, tt := range tests {
		var p4, p6 netip.Prefix
		if tt.v4 != "" {
			p4 = netip.MustParsePrefix(tt.v4)
		}
		if tt.v6 != "" {
			p6 = netip.MustParsePrefix(tt.v6)
		}
		if _, err := New(DefaultConfig(), nil, p4, p6); err == nil {
			t.Errorf("New(%q, %q) accepted", tt.v4, tt.v6)
		}
	}
}

func BenchmarkAllocateRelease(b *testing.B) {
	m := mustNew(b, "10.0.0.0/16", "")
	owners := make([]string, 1024)
	for i := range owners {
		owners[i] = fmt.Sprintf("ns/pod-%d", i)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		o := owners[i%len(owners)]
		a, err := m.AllocateNext(IPv4, o)
		if err != nil {
			b.Fatal(err)
		}
		if err := m.Release(a.IP); err != nil {
			b.Fatal(err)
		}
	}
}

// TestReleaseUnclaimed: a rolled-back ADD releases only what is still its
// own, unclaimed allocation; an address an endpoint claimed, or one handed
// to another owner after a release, stays.
func TestReleaseUnclaimed(t *testing.T) {
	m := mustNew(t, "10.1.0.0/24", "")
	a, err := m.AllocateNext(IPv4, "ns/a")
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Claim(a.IP, ""); err != nil {
		t.Fatal(err)
	}
	if ok, err := m.ReleaseUnclaimed(a.IP, "ns/a"); ok || err != nil {
		t.Fatalf("released a claimed address: %v %v", ok, err)
	}
	if err := m.Release(a.IP); err != nil {
		t.Fatal(err)
	}
	b, err := m.Allocate(a.IP, "ns/b")
	if err != nil {
		t.Fatal(err)
	}
	if ok, _ := m.ReleaseUnclaimed(b.IP, "ns/a"); ok {
		t.Fatal("released another owner's address")
	}
	if ok, err := m.ReleaseUnclaimed(b.IP, "ns/b"); !ok || err != nil {
		t.Fatalf("owner's unclaimed address not released: %v %v", ok, err)
	}
	if _, held := m.Lookup(b.IP); held {
		t.Fatal("address still allocated")
	}
	if ok, err := m.ReleaseUnclaimed(b.IP, "ns/b"); ok || err != nil {
		t.Fatalf("second release: %v %v", ok, err)
	}
}
