package ipcache

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/statedb/reconciler"

	"github.com/tendril-net/tendril/pkg/testutil"
)

// batchBackend writes batches as the BPF map's batch update does: in
// order, stopping at the first element that fails.
type batchBackend struct {
	*fakeBackend
	batches int
}

func (b *batchBackend) UpsertBatch(ps []netip.Prefix, es []Entry) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.batches++
	for i, p := range ps {
		if b.fail[p] {
			return i, errors.New("E2BIG")
		}
		b.m[p] = es[i]
	}
	return len(ps), nil
}

func (b *batchBackend) batchCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.batches
}

// TestBatchStopsOnlyAtTheFailingPrefix: with a backend that writes
// batches, one prefix failing in the middle of a round fails that
// prefix alone (its status, its retries), the prefixes after it in the
// batch are written, and it converges once the fault is gone, without
// any other event.
func TestBatchStopsOnlyAtTheFailingPrefix(t *testing.T) {
	b := &batchBackend{fakeBackend: &fakeBackend{m: map[netip.Prefix]Entry{}, fail: map[netip.Prefix]bool{}}}
	c := startCache(t, b, reconciler.WithRetry(10*time.Millisecond, 50*time.Millisecond))
	bad := netip.MustParsePrefix("10.9.0.5/32")
	b.setFail(bad, true)
	err := c.Write(func(w *Writer) error {
		for i := range 10 {
			p := netip.MustParsePrefix(fmt.Sprintf("10.9.0.%d/32", i))
			if err := w.Upsert(p, Entry{Identity: 300, Source: SourceKubernetes, Owner: OwnerNode(p.String())}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the failing prefix's error in its status", func() bool {
		r := c.Realization()
		return r.Errors == 1 && r.Pending == 0
	})
	if b.batchCount() == 0 {
		t.Fatal("the reconciler did not use the backend's batch update")
	}
	for i := range 10 {
		p := netip.MustParsePrefix(fmt.Sprintf("10.9.0.%d/32", i))
		_, ok := b.get(p)
		if ok == (p == bad) {
			t.Fatalf("%s in the backend: %v", p, ok)
		}
	}
	obj, _, _ := c.Table().Get(c.db.ReadTxn(), PrefixIndex.Query(bad))
	if obj.Status.Kind != reconciler.StatusKindError {
		t.Fatalf("failing prefix's status %s", obj.Status)
	}
	b.setFail(bad, false)
	synced(t, c)
	if e, ok := b.get(bad); !ok || e.Identity != 300 {
		t.Fatalf("after the fault is gone: %+v %v", e, ok)
	}
	if r := c.Realization(); r.Errors != 0 || r.Pending != 0 || r.Objects != 10 {
		t.Fatalf("realization %+v after the retry", r)
	}
}
