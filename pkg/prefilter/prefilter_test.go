package prefilter

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
)

// fakeMaps is a Backend whose writes can be made to fail.
type fakeMaps struct {
	mu      sync.Mutex
	entries map[netip.Prefix]bool
	fail    bool
}

func (f *fakeMaps) Put(p netip.Prefix) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail {
		return errors.New("injected map write error")
	}
	f.entries[p] = true
	return nil
}

func (f *fakeMaps) Delete(p netip.Prefix) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.entries, p)
	return nil
}

func (f *fakeMaps) Prefixes() ([]netip.Prefix, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Collect(maps.Keys(f.entries)), nil
}

func (f *fakeMaps) has() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for p := range f.entries {
		out = append(out, p.String())
	}
	slices.Sort(out)
	return out
}

// start runs a List over b saving to file in a hive of its own (stopped
// at the test's end, or by the returned func: an agent restart).
func start(t *testing.T, b Backend, file string) (*List, func()) {
	t.Helper()
	var l *List
	h := hive.New(
		statedb.Cell,
		job.Cell,
		cell.Provide(func() cell.Health { hl, _ := cell.NewSimpleHealth(); return hl }),
		cell.Module("prefilter-test", "prefilter list under test",
			cell.Invoke(func(db *statedb.DB, jobs job.Registry, hl cell.Health, id cell.FullModuleID, log *slog.Logger) error {
				var err error
				l, err = New(Params{DB: db, Jobs: jobs.NewGroup(hl), Log: log, ModuleID: id, Backend: b, StateFile: file, MaxPerFamily: 3,
					Options: []reconciler.Option{reconciler.WithRetry(10*time.Millisecond, 50*time.Millisecond), reconciler.WithPruning(20 * time.Millisecond)}})
				return err
			})),
	)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := h.Start(quiet, context.Background()); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop := func() { once.Do(func() { _ = h.Stop(quiet, context.Background()) }) }
	t.Cleanup(stop)
	return l, stop
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// eventually polls cond (a generous deadline only for "eventually").
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRevisionsAndInvalidCIDRs: each change moves the revision on; a
// change at a stale revision, or naming one bad CIDR among good ones,
// changes nothing (the list, the maps, the revision, the saved file);
// revision 0 skips the check; a full family refuses the change.
func TestRevisionsAndInvalidCIDRs(t *testing.T) {
	fm := &fakeMaps{entries: map[netip.Prefix]bool{}}
	file := filepath.Join(t.TempDir(), "prefilter.json")
	l, _ := start(t, fm, file)

	if d, _ := l.Get(); d.Revision != 1 || len(d.Deny) != 0 {
		t.Fatalf("a new list = %+v, want revision 1 and nothing denied", d)
	}
	s, err := l.Patch(ctx(t), 1, []string{"198.51.100.9/24", "2001:db8::/32"})
	if err != nil {
		t.Fatal(err)
	}
	if s.Revision != 2 || !slices.Equal(fm.has(), []string{"198.51.100.0/24", "2001:db8::/32"}) {
		t.Fatalf("after patch: %+v, maps %v", s, fm.has())
	}
	if _, r := l.Get(); r.Revision != 2 || len(r.Deny) != 2 {
		t.Fatalf("realized %+v, want revision 2 with both", r)
	}
	saved, _ := os.ReadFile(file)

	if _, err := l.Patch(ctx(t), 1, []string{"192.0.2.0/24"}); !errors.Is(err, ErrStaleRevision) {
		t.Fatalf("stale revision: err %v", err)
	}
	for _, bad := range [][]string{
		{"192.0.2.0/24", "not-a-cidr"},
		{"192.0.2.0/24", "10.0.0.0/33"},
		{"192.0.2.0/24", "::ffff:10.0.0.0/104"},
		{"192.0.2.0/24", "10.1.1.1"},
	} {
		if _, err := l.Patch(ctx(t), 2, bad); !errors.Is(err, ErrInvalidCIDR) {
			t.Errorf("patch %v: err %v, want invalid CIDR", bad, err)
		}
		if _, err := l.Delete(ctx(t), 2, append(bad, "198.51.100.0/24")); !errors.Is(err, ErrInvalidCIDR) {
			t.Errorf("delete %v: err %v, want invalid CIDR", bad, err)
		}
	}
	if _, err := l.Patch(ctx(t), 0, []string{"10.0.0.0/8", "10.1.0.0/16", "10.2.0.0/16"}); !errors.Is(err, ErrFull) {
		t.Errorf("a fourth IPv4 prefix: err %v, want full", err)
	}
	if d, _ := l.Get(); d.Revision != 2 || len(d.Deny) != 2 {
		t.Fatalf("refused changes changed the list: %+v", d)
	}
	if now, _ := os.ReadFile(file); string(now) != string(saved) {
		t.Fatalf("refused changes rewrote the saved list: %s", now)
	}
	if !slices.Equal(fm.has(), []string{"198.51.100.0/24", "2001:db8::/32"}) {
		t.Fatalf("refused changes reached the maps: %v", fm.has())
	}

	s, err = l.Delete(ctx(t), 0, []string{"198.51.100.0/24", "203.0.113.0/24"})
	if err != nil || s.Revision != 3 || !slices.Equal(fm.has(), []string{"2001:db8::/32"}) {
		t.Fatalf("delete at revision 0: %+v %v, maps %v", s, err, fm.has())
	}
}

// TestListSurvivesRestart: the list and its revision come back from the
// state file in a new run; what the maps hold that the list lacks (a
// prefix written by hand) is pruned; a write that fails is retried with
// the error shown meanwhile; a damaged file rebuilds the list from the
// maps rather than dropping what they deny.
func TestListSurvivesRestart(t *testing.T) {
	fm := &fakeMaps{entries: map[netip.Prefix]bool{}}
	file := filepath.Join(t.TempDir(), "prefilter.json")
	l, stop := start(t, fm, file)
	if _, err := l.Patch(ctx(t), 0, []string{"198.51.100.0/24", "2001:db8::/32"}); err != nil {
		t.Fatal(err)
	}
	stop()

	fm.mu.Lock()
	fm.entries[netip.MustParsePrefix("192.0.2.0/24")] = true // by hand
	fm.mu.Unlock()
	l, stop = start(t, fm, file)
	d, _ := l.Get()
	if d.Revision != 2 || !slices.Equal(d.Deny, []string{"198.51.100.0/24", "2001:db8::/32"}) {
		t.Fatalf("restored list %+v", d)
	}
	eventually(t, "the hand-written prefix pruned", func() bool {
		return slices.Equal(fm.has(), []string{"198.51.100.0/24", "2001:db8::/32"})
	})

	fm.mu.Lock()
	fm.fail = true
	fm.mu.Unlock()
	short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := l.Patch(short, 2, []string{"203.0.113.0/24"}); err == nil {
		t.Fatal("a patch whose write fails answered success")
	}
	if n, e := l.Pending(); n != 1 || e == "" {
		t.Fatalf("pending %d %q, want the failing prefix with its error", n, e)
	}
	fm.mu.Lock()
	fm.fail = false
	fm.mu.Unlock()
	eventually(t, "the failed write retried", func() bool { n, _ := l.Pending(); return n == 0 })
	stop()

	if err := os.WriteFile(file, []byte("{garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	l, _ = start(t, fm, file)
	d, _ = l.Get()
	if !slices.Equal(d.Deny, []string{"198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32"}) {
		t.Fatalf("list rebuilt from the maps = %+v", d)
	}
	time.Sleep(50 * time.Millisecond) // a prune round or two
	if len(fm.has()) != 3 {
		t.Fatalf("maps after a damaged file: %v", fm.has())
	}
}
