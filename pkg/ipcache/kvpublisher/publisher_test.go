package kvpublisher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
)

// fakeStore is a store whose writes can be blocked (an etcd that does not
// answer) or failed, and which records what it holds and every write.
type fakeStore struct {
	mu      sync.Mutex
	kv      map[string]string
	writes  []string
	fail    error
	blocked chan struct{} // non-nil: writes wait for it to close (or ctx)
	// entered receives a value (if there is room) as each write starts.
	entered chan struct{}
}

func newFakeStore() *fakeStore {
	return &fakeStore{kv: map[string]string{}, entered: make(chan struct{}, 1)}
}

func (s *fakeStore) gate(ctx context.Context) error {
	s.mu.Lock()
	b, fail := s.blocked, s.fail
	s.mu.Unlock()
	select {
	case s.entered <- struct{}{}:
	default:
	}
	if b != nil {
		select {
		case <-b:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return fail
}

func (s *fakeStore) UpsertLocal(ctx context.Context, name string, value []byte) error {
	if err := s.gate(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.kv[name] = string(value)
	s.writes = append(s.writes, "set "+name+"="+string(value))
	return nil
}

func (s *fakeStore) DeleteLocal(ctx context.Context, name string) error {
	if err := s.gate(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.kv, name)
	s.writes = append(s.writes, "delete "+name)
	return nil
}

func (s *fakeStore) List() map[string][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string][]byte{}
	for k, v := range maps.All(s.kv) {
		out[k] = []byte(v)
	}
	return out
}

func (s *fakeStore) set(fail error, blocked chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail, s.blocked = fail, blocked
}

func (s *fakeStore) content() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k, v := range s.kv {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return fmt.Sprint(out)
}

func (s *fakeStore) takeWrites() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.writes
	s.writes = nil
	return w
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// start runs a publisher over s in a hive (statedb, jobs) stopped at the
// end of the test; writeTimeout and the retry spacing as given. Keys are
// this node's when their value starts with "mine".
func start(t *testing.T, s *fakeStore, writeTimeout, retryMin, retryMax time.Duration) *Publisher {
	t.Helper()
	var pub *Publisher
	h := hive.New(statedb.Cell, job.Cell,
		cell.Provide(func() cell.Health { hl, _ := cell.NewSimpleHealth(); return hl }),
		cell.Module("kvpublisher-test", "publisher under test",
			cell.Invoke(func(db *statedb.DB, jobs job.Registry, hl cell.Health, id cell.FullModuleID) error {
				var err error
				pub, err = New(Params{DB: db, Jobs: jobs.NewGroup(hl), Log: quiet(), ModuleID: id, Store: s,
					Owned:        func(_ string, v []byte) bool { return strings.HasPrefix(string(v), "mine") },
					WriteTimeout: writeTimeout,
					Options:      []reconciler.Option{reconciler.WithRetry(retryMin, retryMax)}})
				return err
			})))
	if err := h.Start(quiet(), context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Stop(quiet(), context.Background()) })
	return pub
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// eventually polls cond until it holds; the deadline only keeps a broken
// publisher from hanging the test.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestSetAndDeleteDoNotWaitForTheStore: with the store not answering at
// all, Set and Delete still return (they only record), the keys are
// pending, and once the store answers they land; a key set and deleted
// meanwhile ends up absent.
func TestSetAndDeleteDoNotWaitForTheStore(t *testing.T) {
	s := newFakeStore()
	stuck := make(chan struct{})
	s.set(nil, stuck)
	p := start(t, s, time.Hour, time.Millisecond, 10*time.Millisecond)
	// A store that never answers: these calls would never return if they
	// waited for it.
	must(t, p.Set("10.0.0.1", []byte("a")))
	must(t, p.Set("10.0.0.2", []byte("b")))
	must(t, p.Set("10.0.0.3", []byte("c")))
	must(t, p.Delete("10.0.0.3"))
	must(t, p.Set("10.0.0.1", []byte("a2")))
	if st := p.Status(); st.Keys != 2 || st.Pending != 3 {
		t.Fatalf("status while the store hangs: %+v, want 2 keys and 3 pending", st)
	}
	close(stuck)
	eventually(t, "every change written", func() bool { return p.Status().Pending == 0 })
	if got, want := s.content(), "[10.0.0.1=a2 10.0.0.2=b]"; got != want {
		t.Fatalf("store holds %s, want %s", got, want)
	}
	if got := p.Keys(); fmt.Sprint(got) != "[10.0.0.1 10.0.0.2]" {
		t.Fatalf("keys %v", got)
	}
	// An unchanged value is not written again; a delete of a key never set
	// writes nothing.
	s.takeWrites()
	must(t, p.Set("10.0.0.2", []byte("b")))
	must(t, p.Delete("10.0.0.9"))
	must(t, p.Delete("10.0.0.2"))
	eventually(t, "delete written", func() bool { return p.Status().Pending == 0 })
	if w := s.takeWrites(); fmt.Sprint(w) != "[delete 10.0.0.2]" {
		t.Fatalf("writes %q, want only the delete", w)
	}
}

// TestFailedWritesAreRetried: writes that fail are retried until the store
// takes them, and the last error is reported meanwhile.
func TestFailedWritesAreRetried(t *testing.T) {
	s := newFakeStore()
	s.set(errors.New("etcdserver: request timed out"), nil)
	p := start(t, s, time.Second, time.Millisecond, 10*time.Millisecond)
	must(t, p.Set("10.0.0.1", []byte("a")))
	eventually(t, "the failure reported", func() bool { return p.Status().LastError != nil })
	if st := p.Status(); st.Pending != 1 || st.LastErrorAt.IsZero() {
		t.Fatalf("status after a failed write: %+v", st)
	}
	s.set(nil, nil)
	eventually(t, "the write retried", func() bool { return p.Status().Pending == 0 })
	if got := s.content(); got != "[10.0.0.1=a]" {
		t.Fatalf("store holds %s", got)
	}
}

// TestRenewalPublishesEverythingAgain: after a new session (the keys went
// with the old lease) every key is written again.
func TestRenewalPublishesEverythingAgain(t *testing.T) {
	s := newFakeStore()
	p := start(t, s, time.Second, time.Millisecond, 10*time.Millisecond)
	must(t, p.Set("10.0.0.1", []byte("a")))
	must(t, p.Set("10.0.0.2", []byte("b")))
	eventually(t, "first writes", func() bool { return p.Status().Pending == 0 })
	// The lease expired: etcd dropped the keys.
	s.mu.Lock()
	s.kv = map[string]string{}
	s.mu.Unlock()
	s.takeWrites()
	p.Republish()
	eventually(t, "keys written again", func() bool { return s.content() == "[10.0.0.1=a 10.0.0.2=b]" })
	if w := s.takeWrites(); len(w) != 2 {
		t.Fatalf("writes after the renewal %q, want one per key", w)
	}
}

// TestChangeDuringWriteIsWrittenToo: a value changed while its previous
// value is being written is not marked done by that write.
func TestChangeDuringWriteIsWrittenToo(t *testing.T) {
	s := newFakeStore()
	gate := make(chan struct{})
	s.set(nil, gate)
	p := start(t, s, time.Hour, time.Millisecond, 10*time.Millisecond)
	must(t, p.Set("10.0.0.1", []byte("old")))
	// The first write has started; the value changes under it.
	<-s.entered
	must(t, p.Set("10.0.0.1", []byte("new")))
	close(gate)
	eventually(t, "settled", func() bool { return p.Status().Pending == 0 })
	if got := s.content(); got != "[10.0.0.1=new]" {
		t.Fatalf("store holds %s, want the newer value", got)
	}
}

// TestPruneAfterRestoreAndListing: this node's keys that the table does
// not want (an earlier run's, its lease still alive) are deleted only once
// both the restored endpoints and the kvstore's first listing are in;
// other nodes' keys are never touched.
func TestPruneAfterRestoreAndListing(t *testing.T) {
	s := newFakeStore()
	s.kv["10.0.0.7"] = "mine-stale"
	s.kv["10.0.0.8"] = "theirs"
	p := start(t, s, time.Second, time.Millisecond, 10*time.Millisecond)
	must(t, p.Set("10.0.0.1", []byte("mine-a")))
	eventually(t, "first write", func() bool { return p.Status().Pending == 0 })
	p.MarkRestored()
	time.Sleep(100 * time.Millisecond)
	if got := s.content(); !strings.Contains(got, "10.0.0.7=") {
		t.Fatalf("pruned before the first listing: %s", got)
	}
	p.MarkListed()
	eventually(t, "stale key pruned", func() bool { return s.content() == "[10.0.0.1=mine-a 10.0.0.8=theirs]" })
}

// TestStatusInTable: each key's status is in the table, an error with
// its message while the store fails, and a deleted key stays visible (as
// a pending or failing delete) until the store confirms it.
func TestStatusInTable(t *testing.T) {
	s := newFakeStore()
	p := start(t, s, time.Second, time.Millisecond, 10*time.Millisecond)
	must(t, p.Set("10.0.0.1", []byte("a")))
	eventually(t, "written", func() bool { return p.Status().Pending == 0 })
	s.set(errors.New("etcdserver: no leader"), nil)
	must(t, p.Delete("10.0.0.1"))
	statusOf := func() string {
		k, _, ok := p.Table().Get(p.DB().ReadTxn(), NameIndex.Query("10.0.0.1"))
		if !ok {
			return "absent"
		}
		return fmt.Sprintf("tombstone=%v %s", k.Tombstone(), k.Reconciliation.String())
	}
	eventually(t, "delete failing in the table", func() bool {
		return strings.HasPrefix(statusOf(), "tombstone=true Error") && strings.Contains(statusOf(), "no leader")
	})
	if st := p.Status(); st.Keys != 0 || st.Pending != 1 {
		t.Fatalf("status with a failing delete %+v, want 0 keys, 1 pending", st)
	}
	s.set(nil, nil)
	eventually(t, "tombstone dropped once deleted", func() bool { return statusOf() == "absent" })
	if got := s.content(); got != "[]" {
		t.Fatalf("store holds %s", got)
	}
}
