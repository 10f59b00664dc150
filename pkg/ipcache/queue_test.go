package ipcache

import (
	"context"
	"encoding/binary"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/tendril-net/tendril/pkg/identity"
)

func queuedAddr(i int) netip.Prefix {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], 0x0a400000+uint32(i))
	return netip.PrefixFrom(netip.AddrFrom4(b), 32)
}

// TestQueuedClaimsInOrder: claims and withdrawals queued one event at a
// time are applied in the order they were queued and reach the backend.
func TestQueuedClaimsInOrder(t *testing.T) {
	b := &fakeBackend{m: map[netip.Prefix]Entry{}, fail: map[netip.Prefix]bool{}}
	c := startCache(t, b)
	const n = 5000
	for i := range n {
		owner := OwnerTendrilEndpoint("ns", strconv.Itoa(i))
		if err := c.UpsertQueued(queuedAddr(i), Entry{Identity: identity.NumericIdentity(1000 + i), Source: SourceKubernetes, Owner: owner}); err != nil {
			t.Fatal(err)
		}
		if i%2 == 1 {
			// The odd ones are withdrawn right after being claimed.
			c.DeleteQueued(queuedAddr(i), SourceKubernetes, owner)
		}
	}
	// A withdrawal queued before a new claim of the same owner does not
	// remove the new claim.
	p := queuedAddr(n + 1)
	owner := OwnerKVStore("k")
	c.DeleteQueued(p, SourceKVStore, owner)
	if err := c.UpsertQueued(p, Entry{Identity: 77, Source: SourceKVStore, Owner: owner}); err != nil {
		t.Fatal(err)
	}
	synced(t, c)
	for i := range n {
		e, ok := b.get(queuedAddr(i))
		if i%2 == 1 {
			if ok {
				t.Fatalf("%s: withdrawn claim left in the backend: %+v", queuedAddr(i), e)
			}
			continue
		}
		if !ok || e.Identity != identity.NumericIdentity(1000+i) {
			t.Fatalf("%s: backend %+v %v", queuedAddr(i), e, ok)
		}
	}
	if e, ok := b.get(p); !ok || e.Identity != 77 {
		t.Fatalf("claim after its own withdrawal: %+v %v", e, ok)
	}
}

// TestQueuedClaimRefusedAtOnce: a claim without owner is refused by the
// caller's call, not dropped silently later.
func TestQueuedClaimRefusedAtOnce(t *testing.T) {
	c := startCache(t, &fakeBackend{m: map[netip.Prefix]Entry{}, fail: map[netip.Prefix]bool{}})
	if err := c.UpsertQueued(queuedAddr(1), Entry{Identity: 5, Source: SourceKVStore}); err == nil {
		t.Fatal("a claim without owner was queued")
	}
}

// TestInitializerAfterQueuedClaims: a source that queues its listing and
// then marks it in (AddInitializer's function) never lets the prune see
// the table before the listing's claims are in it.
func TestInitializerAfterQueuedClaims(t *testing.T) {
	c := startCache(t, &fakeBackend{m: map[netip.Prefix]Entry{}, fail: map[netip.Prefix]bool{}})
	listed := c.AddInitializer("listing")
	c.MarkRestored()
	const n = 3000
	for i := range n {
		if err := c.UpsertQueued(queuedAddr(i), Entry{Identity: 9, Source: SourceKVStore, Owner: OwnerKVStore(strconv.Itoa(i))}); err != nil {
			t.Fatal(err)
		}
	}
	listed()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		txn := c.db.ReadTxn()
		init, watch := c.table.Initialized(txn)
		if init {
			if got := c.table.NumObjects(txn); got != n {
				t.Fatalf("table initialized with %d of the %d claims queued before", got, n)
			}
			return
		}
		select {
		case <-watch:
		case <-ctx.Done():
			t.Fatal("table not initialized")
		}
	}
}
