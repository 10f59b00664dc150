package ipcache

import (
	"errors"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/statedb/reconciler"

	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/testutil"
)

type fakeBackend struct {
	mu   sync.Mutex
	m    map[netip.Prefix]Entry
	fail map[netip.Prefix]bool
	ops  int
}

func (f *fakeBackend) Upsert(p netip.Prefix, e Entry) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ops++
	if f.fail[p] {
		return errors.New("E2BIG")
	}
	f.m[p] = e
	return nil
}

func (f *fakeBackend) Delete(p netip.Prefix) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ops++
	if f.fail[p] {
		return errors.New("EPERM")
	}
	delete(f.m, p)
	return nil
}

func (f *fakeBackend) Prefixes() ([]netip.Prefix, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]netip.Prefix, 0, len(f.m))
	for p := range f.m {
		out = append(out, p)
	}
	return out, nil
}

func (f *fakeBackend) setFail(p netip.Prefix, fail bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail[p] = fail
}

func (f *fakeBackend) opCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ops
}

func (f *fakeBackend) get(p netip.Prefix) (Entry, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, ok := f.m[p]
	return e, ok
}

func TestSourcePrecedence(t *testing.T) {
	b := &fakeBackend{m: map[netip.Prefix]Entry{}, fail: map[netip.Prefix]bool{}}
	c := startCache(t, b)
	pod := netip.MustParsePrefix("10.0.1.5/32")
	cidrOwner, epOwner, remoteOwner := OwnerPolicyCIDR(pod), OwnerEndpoint(1), OwnerTendrilEndpoint("ns", "web")
	steps := []struct {
		name   string
		do     func() error
		wantID identity.NumericIdentity // 0: absent from the backend
	}{
		{"policy CIDR equal to the pod's address", func() error {
			return c.Upsert(pod, Entry{Identity: identity.NumericIdentity(1<<24 | 1), Source: SourceGenerated, Owner: cidrOwner})
		}, 1<<24 | 1},
		{"the pod's endpoint takes over", func() error {
			return c.Upsert(pod, Entry{Identity: 300, Source: SourceLocal, Owner: epOwner, Name: "web"})
		}, 300},
		{"a remote claim does not override the local endpoint", func() error {
			return c.Upsert(pod, Entry{Identity: 400, Source: SourceKubernetes, Owner: remoteOwner})
		}, 300},
		{"removing the CIDR rule leaves the pod alone", func() error { return c.Delete(pod, SourceGenerated, cidrOwner) }, 300},
		{"endpoint deleted: the remote claim shows", func() error { return c.Delete(pod, SourceLocal, epOwner) }, 400},
		{"deleting an absent claim is a no-op", func() error { return c.Delete(pod, SourceLocal, epOwner) }, 400},
		{"last claim gone: removed", func() error { return c.Delete(pod, SourceKubernetes, remoteOwner) }, 0},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		synced(t, c)
		e, ok := b.get(pod)
		if s.wantID == 0 {
			if ok {
				t.Fatalf("%s: still in the backend: %+v", s.name, e)
			}
			continue
		}
		if !ok || e.Identity != s.wantID {
			t.Fatalf("%s: backend has %+v (present %v), want identity %d", s.name, e, ok, s.wantID)
		}
	}
	// An unchanged winner is not rewritten.
	_ = c.Upsert(pod, Entry{Identity: 300, Source: SourceLocal, Owner: epOwner})
	synced(t, c)
	before := b.opCount()
	_ = c.Upsert(pod, Entry{Identity: 300, Source: SourceLocal, Owner: epOwner})
	_ = c.Upsert(pod, Entry{Identity: 5, Source: SourceGenerated, Owner: cidrOwner})
	synced(t, c)
	if after := b.opCount(); after != before {
		t.Fatalf("%d backend writes for changes that did not change the winner", after-before)
	}
}

// TestFailedWritesAreRetried: a backend write that fails leaves the claim
// in the table with the error in its status, and the reconciler retries it
// (with backoff) until it succeeds, without any other event; a failed
// delete is retried the same way.
func TestFailedWritesAreRetried(t *testing.T) {
	b := &fakeBackend{m: map[netip.Prefix]Entry{}, fail: map[netip.Prefix]bool{}}
	c := startCache(t, b, reconciler.WithRetry(10*time.Millisecond, 50*time.Millisecond))
	p := netip.MustParsePrefix("10.0.2.0/24")
	b.setFail(p, true)
	if err := c.Upsert(p, Entry{Identity: 7, Source: SourceKubernetes, Owner: OwnerNode("b")}); err != nil {
		t.Fatalf("a writer waited for the backend: %v", err)
	}
	status := func() reconciler.Status {
		obj, _, ok := c.Table().Get(c.db.ReadTxn(), PrefixIndex.Query(p))
		if !ok {
			t.Fatal("the claim is lost when the write fails")
		}
		return obj.Status
	}
	testutil.Eventually(t, 10*time.Second, "the error in the object's status", func() bool {
		return status().Kind == reconciler.StatusKindError && strings.Contains(status().GetError(), "E2BIG")
	})
	if r := c.Realization(); r.Errors != 1 || r.Objects != 1 || !strings.Contains(r.LastError, "E2BIG") {
		t.Fatalf("realization %+v, want one error", r)
	}
	if e, ok := c.Lookup(p); !ok || e.Identity != 7 {
		t.Fatal("the claim is lost when the write fails")
	}
	first := b.opCount()
	testutil.Eventually(t, 10*time.Second, "retries of the failed write", func() bool { return b.opCount() >= first+2 })
	if _, ok := b.get(p); ok {
		t.Fatal("a failing write reached the backend")
	}
	b.setFail(p, false)
	synced(t, c)
	if e, ok := b.get(p); !ok || e.Identity != 7 {
		t.Fatalf("after the fault is gone: %+v %v", e, ok)
	}
	if st := status(); st.Kind != reconciler.StatusKindDone {
		t.Fatalf("status %s after success", st)
	}
	if r := c.Realization(); r.Errors != 0 || r.Pending != 0 {
		t.Fatalf("realization %+v after success", r)
	}

	// A failed delete is retried too.
	b.setFail(p, true)
	before := b.opCount()
	if err := c.Delete(p, SourceKubernetes, OwnerNode("b")); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "retries of the failed delete", func() bool { return b.opCount() >= before+2 })
	if _, ok := b.get(p); !ok {
		t.Fatal("a failing delete removed the entry")
	}
	b.setFail(p, false)
	synced(t, c)
	if _, ok := b.get(p); ok {
		t.Fatal("deleted prefix still in the backend after the retry")
	}
	if len(c.List()) != 0 {
		t.Fatalf("list %v", c.List())
	}
}

// ownerOf names a distinct owner in src, as the agent's callers do.
func ownerOf(src Source, object string) Owner {
	switch src {
	case SourceLocal:
		return Owner("endpoint/" + object)
	case SourceKubernetes:
		return OwnerTendrilEndpoint("ns", object)
	case SourceKVStore:
		return OwnerKVStore(object)
	}
	return Owner("policy-cidr/" + object)
}

// TestDeleteOfOldObjectKeepsNewerClaim: an address moves from an old
// object to a newer one (a pod deleted and its address reused, a node
// replaced), and the old object's delete arrives after the newer object's
// claim. For every pair of sources, including two owners of one source,
// the delete withdraws only the old object's claim: the newer claim is the
// effective entry afterwards, and the backend holds it.
func TestDeleteOfOldObjectKeepsNewerClaim(t *testing.T) {
	ip := netip.MustParsePrefix("10.0.7.9/32")
	for _, oldSrc := range Sources() {
		for _, newSrc := range Sources() {
			t.Run(oldSrc.String()+"-then-"+newSrc.String(), func(t *testing.T) {
				b := &fakeBackend{m: map[netip.Prefix]Entry{}, fail: map[netip.Prefix]bool{}}
				c := startCache(t, b)
				oldE := Entry{Identity: 1001, Source: oldSrc, Owner: ownerOf(oldSrc, "old"), Name: "old"}
				newE := Entry{Identity: 2002, Source: newSrc, Owner: ownerOf(newSrc, "new"), Name: "new"}
				if err := c.Upsert(ip, oldE); err != nil {
					t.Fatal(err)
				}
				if err := c.Upsert(ip, newE); err != nil {
					t.Fatal(err)
				}
				synced(t, c)
				// While both claim it, the higher source wins, and of one
				// source the newer claim.
				wantBoth := newE
				if oldSrc > newSrc {
					wantBoth = oldE
				}
				if e, ok := b.get(ip); !ok || e != wantBoth {
					t.Fatalf("with both claims the backend has %+v (present %v), want %+v", e, ok, wantBoth)
				}
				if got := c.Claims(ip); len(got) != 2 || got[0] != wantBoth {
					t.Fatalf("claims %+v, want two with %+v first", got, wantBoth)
				}
				if err := c.Delete(ip, oldSrc, oldE.Owner); err != nil {
					t.Fatal(err)
				}
				synced(t, c)
				if e, ok := c.Lookup(ip); !ok || e != newE {
					t.Fatalf("after the old object's delete the effective entry is %+v (present %v), want the newer claim %+v", e, ok, newE)
				}
				if e, ok := b.get(ip); !ok || e != newE {
					t.Fatalf("after the old object's delete the backend has %+v (present %v), want the newer claim %+v", e, ok, newE)
				}
				// The newer object's own delete empties the prefix.
				if err := c.Delete(ip, newSrc, newE.Owner); err != nil {
					t.Fatal(err)
				}
				synced(t, c)
				if e, ok := b.get(ip); ok {
					t.Fatalf("after both deletes the backend still has %+v", e)
				}
			})
		}
	}
}

// TestSameSourceMostRecentClaimWins: of one source's claims the most
// recent wins while it exists; an owner changing its claim (a resync, a new
// identity) does not make it more recent; removing the winner falls back
// to the next most recent.
func TestSameSourceMostRecentClaimWins(t *testing.T) {
	b := &fakeBackend{m: map[netip.Prefix]Entry{}, fail: map[netip.Prefix]bool{}}
	c := startCache(t, b)
	ip := netip.MustParsePrefix("172.30.0.5/32")
	n1, n2, n3 := OwnerNode("n1"), OwnerNode("n2"), OwnerNode("n3")
	steps := []struct {
		name   string
		do     func() error
		wantID identity.NumericIdentity
	}{
		{"n1 claims", func() error { return c.Upsert(ip, Entry{Identity: 1, Source: SourceKubernetes, Owner: n1}) }, 1},
		{"n2 claims later and wins", func() error { return c.Upsert(ip, Entry{Identity: 2, Source: SourceKubernetes, Owner: n2}) }, 2},
		{"n3 claims later still", func() error { return c.Upsert(ip, Entry{Identity: 3, Source: SourceKubernetes, Owner: n3}) }, 3},
		{"n1 resyncs its claim: still the oldest", func() error {
			return c.Upsert(ip, Entry{Identity: 11, Source: SourceKubernetes, Owner: n1})
		}, 3},
		{"n3 changes its claim: it keeps winning", func() error {
			return c.Upsert(ip, Entry{Identity: 33, Source: SourceKubernetes, Owner: n3})
		}, 33},
		{"the winner goes: the next most recent", func() error { return c.Delete(ip, SourceKubernetes, n3) }, 2},
		{"an owner's claim in another source is not its claim here", func() error { return c.Delete(ip, SourceKVStore, n2) }, 2},
		{"n2 goes: n1's changed claim", func() error { return c.Delete(ip, SourceKubernetes, n2) }, 11},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		synced(t, c)
		if e, ok := b.get(ip); !ok || e.Identity != s.wantID {
			t.Fatalf("%s: backend has %+v (present %v), want identity %d", s.name, e, ok, s.wantID)
		}
	}
	if err := c.Upsert(ip, Entry{Identity: 9, Source: SourceKubernetes}); err == nil {
		t.Fatal("a claim without an owner was accepted")
	}
}

// TestWriteIsOneTransaction: the claims of one Write commit together, or
// none of them when the function fails.
func TestWriteIsOneTransaction(t *testing.T) {
	b := &fakeBackend{m: map[netip.Prefix]Entry{}, fail: map[netip.Prefix]bool{}}
	c := startCache(t, b)
	p1, p2 := netip.MustParsePrefix("10.1.0.1/32"), netip.MustParsePrefix("10.1.0.2/32")
	err := c.Write(func(w *Writer) error {
		if err := w.Upsert(p1, Entry{Identity: 10, Source: SourceKubernetes, Owner: OwnerNode("a")}); err != nil {
			return err
		}
		return w.Upsert(p2, Entry{Identity: 11, Source: SourceKubernetes}) // no owner
	})
	if err == nil {
		t.Fatal("a claim without an owner was accepted")
	}
	if _, ok := c.Lookup(p1); ok {
		t.Fatal("a failed Write committed part of its claims")
	}
	if err := c.Write(func(w *Writer) error {
		if err := w.Upsert(p1, Entry{Identity: 10, Source: SourceKubernetes, Owner: OwnerNode("a")}); err != nil {
			return err
		}
		return w.Upsert(p2, Entry{Identity: 11, Source: SourceKubernetes, Owner: OwnerNode("b")})
	}); err != nil {
		t.Fatal(err)
	}
	synced(t, c)
	for p, id := range map[netip.Prefix]identity.NumericIdentity{p1: 10, p2: 11} {
		if e, ok := b.get(p); !ok || e.Identity != id {
			t.Fatalf("%s in the backend: %+v %v, want identity %d", p, e, ok, id)
		}
	}
}
