package ipcache

import (
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"sync"
	"testing"

	"github.com/tendril-net/tendril/pkg/identity"
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

func (f *fakeBackend) get(p netip.Prefix) (Entry, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, ok := f.m[p]
	return e, ok
}

func TestSourcePrecedence(t *testing.T) {
	b := &fakeBackend{m: map[netip.Prefix]Entry{}, fail: map[netip.Prefix]bool{}}
	c := New(b, slog.New(slog.NewTextHandler(io.Discard, nil)))
	pod := netip.MustParsePrefix("10.0.1.5/32")
	steps := []struct {
		name   string
		do     func() error
		wantID identity.NumericIdentity // 0: absent from the backend
	}{
		{"policy CIDR equal to the pod's address", func() error {
			return c.Upsert(pod, Entry{Identity: identity.NumericIdentity(1<<24 | 1), Source: SourceGenerated})
		}, 1<<24 | 1},
		{"the pod's endpoint takes over", func() error { return c.Upsert(pod, Entry{Identity: 300, Source: SourceLocal, Name: "web"}) }, 300},
		{"a remote claim does not override the local endpoint", func() error {
			return c.Upsert(pod, Entry{Identity: 400, Source: SourceKubernetes})
		}, 300},
		{"removing the CIDR rule leaves the pod alone", func() error { return c.Delete(pod, SourceGenerated) }, 300},
		{"endpoint deleted: the remote claim shows", func() error { return c.Delete(pod, SourceLocal) }, 400},
		{"deleting an absent claim is a no-op", func() error { return c.Delete(pod, SourceLocal) }, 400},
		{"last claim gone: removed", func() error { return c.Delete(pod, SourceKubernetes) }, 0},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
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
	_ = c.Upsert(pod, Entry{Identity: 300, Source: SourceLocal})
	before := b.ops
	_ = c.Upsert(pod, Entry{Identity: 300, Source: SourceLocal})
	_ = c.Upsert(pod, Entry{Identity: 5, Source: SourceGenerated})
	if b.ops != before {
		t.Fatalf("%d backend writes for changes that did not change the winner", b.ops-before)
	}
}

func TestFailedWritesAreRetried(t *testing.T) {
	b := &fakeBackend{m: map[netip.Prefix]Entry{}, fail: map[netip.Prefix]bool{}}
	c := New(b, slog.New(slog.NewTextHandler(io.Discard, nil)))
	p := netip.MustParsePrefix("10.0.2.0/24")
	b.fail[p] = true
	if err := c.Upsert(p, Entry{Identity: 7, Source: SourceKubernetes}); err == nil {
		t.Fatal("a failed write was not reported")
	}
	if c.Pending() != 1 {
		t.Fatalf("pending %d", c.Pending())
	}
	if e, ok := c.Lookup(p); !ok || e.Identity != 7 {
		t.Fatal("the claim is lost when the write fails")
	}
	if err := c.Sync(); err == nil {
		t.Fatal("sync while still failing reported success")
	}
	b.fail[p] = false
	if err := c.Sync(); err != nil {
		t.Fatal(err)
	}
	if e, ok := b.get(p); !ok || e.Identity != 7 || c.Pending() != 0 {
		t.Fatalf("after retry: %+v %v pending %d", e, ok, c.Pending())
	}
	// A failed delete is retried too.
	b.fail[p] = true
	_ = c.Delete(p, SourceKubernetes)
	b.fail[p] = false
	if err := c.Sync(); err != nil {
		t.Fatal(err)
	}
	if _, ok := b.get(p); ok {
		t.Fatal("deleted prefix still in the backend after the retry")
	}
	if len(c.List()) != 0 {
		t.Fatalf("list %v", c.List())
	}
}
