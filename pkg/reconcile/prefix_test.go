package reconcile

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"

	"github.com/tendril-net/tendril/pkg/reconcile/reconciletest"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// fakeKernel is a prefix-keyed kernel table in memory, with failures to
// inject: the logic above it (PrefixOps) is what these tests are about;
// the privileged tests of ipcache, policycidr and nodemanager write the
// real map and routing table through it.
type fakeKernel struct {
	mu      sync.Mutex
	held    map[netip.Prefix]string
	failPut map[netip.Prefix]error
	failDel map[netip.Prefix]error
	failLs  error
	// listing is set while a listing is walked: a delete then fails the
	// test (Prune must list before it deletes).
	listing bool
	t       *testing.T
}

func newFakeKernel(t *testing.T) *fakeKernel {
	return &fakeKernel{held: map[netip.Prefix]string{}, failPut: map[netip.Prefix]error{}, failDel: map[netip.Prefix]error{}, t: t}
}

func (k *fakeKernel) put(p netip.Prefix, v string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.failPut[p]; err != nil {
		return err
	}
	k.held[p] = v
	return nil
}

func (k *fakeKernel) del(p netip.Prefix) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.listing {
		k.t.Errorf("delete of %s while the listing is walked", p)
	}
	if err := k.failDel[p]; err != nil {
		return err
	}
	delete(k.held, p)
	return nil
}

// list yields each held prefix with its value as a log field, reading
// the table as it goes (as a lazy kernel listing would).
func (k *fakeKernel) list() (iter.Seq2[netip.Prefix, []any], error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.failLs != nil {
		return nil, k.failLs
	}
	keys := slices.SortedFunc(maps.Keys(k.held), func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return func(yield func(netip.Prefix, []any) bool) {
		k.mu.Lock()
		k.listing = true
		k.mu.Unlock()
		defer func() { k.mu.Lock(); k.listing = false; k.mu.Unlock() }()
		for _, p := range keys {
			k.mu.Lock()
			v := k.held[p]
			k.mu.Unlock()
			if !yield(p, []any{"value", v}) {
				return
			}
		}
	}, nil
}

func (k *fakeKernel) get(p netip.Prefix) (string, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	v, ok := k.held[p]
	return v, ok
}

func (k *fakeKernel) setFailPut(p netip.Prefix, err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.failPut[p] = err
}

// obj is the test table's object.
type obj struct {
	Prefix netip.Prefix
	Value  string
	Status reconciler.Status
}

func (o *obj) TableHeader() []string { return []string{"Prefix", "Value", "Status"} }
func (o *obj) TableRow() []string    { return []string{o.Prefix.String(), o.Value, o.Status.String()} }

var objIndex = statedb.Index[*obj, netip.Prefix]{
	Name:       "prefix",
	FromObject: func(o *obj) index.KeySet { return index.NewKeySet(index.NetIPPrefix(o.Prefix)) },
	FromKey:    index.NetIPPrefix,
	FromString: index.NetIPPrefixString,
	Unique:     true,
}

func (k *fakeKernel) ops(pruned *[]Stale) PrefixOps[*obj] {
	return PrefixOps[*obj]{
		Prefix: func(o *obj) netip.Prefix { return o.Prefix },
		Kernel: PrefixKernel[*obj]{
			Put:    func(p netip.Prefix, o *obj) error { return k.put(p, o.Value) },
			Delete: k.del,
			List:   k.list,
		},
		Entry:  "entry",
		Pruned: func(gone []Stale) { *pruned = append(*pruned, gone...) },
	}
}

func objsOf(os ...*obj) iter.Seq2[*obj, statedb.Revision] {
	return func(yield func(*obj, statedb.Revision) bool) {
		for i, o := range os {
			if !yield(o, statedb.Revision(i+1)) {
				return
			}
		}
	}
}

var (
	pfA = netip.MustParsePrefix("10.0.0.1/32")
	pfB = netip.MustParsePrefix("10.0.1.0/24")
	pfC = netip.MustParsePrefix("10.0.2.0/24")
	pfD = netip.MustParsePrefix("10.0.3.0/24")
	pfE = netip.MustParsePrefix("10.0.4.0/24")
)

func TestPrefixOpsUpdateDelete(t *testing.T) {
	k := newFakeKernel(t)
	var pruned []Stale
	ops := k.ops(&pruned)
	ctx := context.Background()
	if err := ops.Update(ctx, nil, 1, &obj{Prefix: pfA, Value: "one"}); err != nil {
		t.Fatal(err)
	}
	if err := ops.Update(ctx, nil, 2, &obj{Prefix: pfB, Value: "two"}); err != nil {
		t.Fatal(err)
	}
	if err := ops.Update(ctx, nil, 3, &obj{Prefix: pfA, Value: "three"}); err != nil {
		t.Fatal(err)
	}
	if v, ok := k.get(pfA); !ok || v != "three" {
		t.Fatalf("%s holds %q (%v) after its second update, want three", pfA, v, ok)
	}
	busy := errors.New("busy")
	k.setFailPut(pfC, busy)
	if err := ops.Update(ctx, nil, 4, &obj{Prefix: pfC, Value: "four"}); !errors.Is(err, busy) {
		t.Fatalf("failed put returned %v, want the kernel's error", err)
	}
	if err := ops.Delete(ctx, nil, 5, &obj{Prefix: pfA}); err != nil {
		t.Fatal(err)
	}
	if _, ok := k.get(pfA); ok {
		t.Fatalf("%s still held after its delete", pfA)
	}
	if v, ok := k.get(pfB); !ok || v != "two" {
		t.Fatalf("the delete of %s took %s with it (%q %v)", pfA, pfB, v, ok)
	}
	// An absent prefix is the kernel's business: Delete passes it on.
	if err := ops.Delete(ctx, nil, 6, &obj{Prefix: pfA}); err != nil {
		t.Fatal(err)
	}
	if len(pruned) != 0 {
		t.Fatalf("Pruned told %v without a prune", pruned)
	}
}

// TestPrefixOpsPrune: the kernel holds the table's prefix A, stale B, C
// and D (C's delete fails, D's too with another error) and not E, which
// the table has. The prune deletes B, keeps A, writes nothing for E,
// reports B to Pruned with its listing's log fields, and returns both
// failures joined, each naming its prefix.
func TestPrefixOpsPrune(t *testing.T) {
	k := newFakeKernel(t)
	for p, v := range map[netip.Prefix]string{pfA: "a", pfB: "b", pfC: "c", pfD: "d"} {
		if err := k.put(p, v); err != nil {
			t.Fatal(err)
		}
	}
	k.failDel[pfC] = errors.New("busy")
	k.failDel[pfD] = errors.New("gone away")
	var pruned []Stale
	ops := k.ops(&pruned)
	err := ops.Prune(context.Background(), nil, objsOf(&obj{Prefix: pfA, Value: "a"}, &obj{Prefix: pfE, Value: "e"}))
	want := "prune entry 10.0.2.0/24: busy\nprune entry 10.0.3.0/24: gone away"
	if err == nil || err.Error() != want {
		t.Fatalf("prune returned %q, want %q", err, want)
	}
	if _, ok := k.get(pfA); !ok {
		t.Fatalf("the prune deleted %s, which the table has", pfA)
	}
	if _, ok := k.get(pfB); ok {
		t.Fatalf("the prune kept stale %s", pfB)
	}
	if _, ok := k.get(pfE); ok {
		t.Fatalf("the prune wrote %s (writes are Update's)", pfE)
	}
	if got := fmt.Sprint(pruned); got != fmt.Sprint([]Stale{{Prefix: pfB, Attrs: []any{"value", "b"}}}) {
		t.Fatalf("Pruned told %s, want B with its log fields", got)
	}

	// The failed deletes went on: C and D go at the next prune, and
	// what is told is only what went.
	delete(k.failDel, pfC)
	delete(k.failDel, pfD)
	pruned = nil
	if err := ops.Prune(context.Background(), nil, objsOf(&obj{Prefix: pfA})); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(pruned); got != fmt.Sprint([]Stale{{Prefix: pfC, Attrs: []any{"value", "c"}}, {Prefix: pfD, Attrs: []any{"value", "d"}}}) {
		t.Fatalf("second prune told %s, want C and D", got)
	}
	// Nothing stale: Pruned is not told.
	pruned = nil
	if err := ops.Prune(context.Background(), nil, objsOf(&obj{Prefix: pfA})); err != nil {
		t.Fatal(err)
	}
	if pruned != nil {
		t.Fatalf("Pruned told %v when nothing was stale", pruned)
	}
	if _, ok := k.get(pfA); !ok {
		t.Fatalf("a prune deleted %s, which the table has", pfA)
	}
}

// TestPrefixOpsPruneListFails: a failed listing deletes nothing and is
// returned as the kernel said it; without Entry a failed delete names
// the prefix alone.
func TestPrefixOpsPruneListFails(t *testing.T) {
	k := newFakeKernel(t)
	if err := k.put(pfB, "b"); err != nil {
		t.Fatal(err)
	}
	listErr := errors.New("list the test map: no map")
	k.failLs = listErr
	var pruned []Stale
	ops := k.ops(&pruned)
	if err := ops.Prune(context.Background(), nil, objsOf()); err != listErr {
		t.Fatalf("prune with a failed listing returned %v, want the listing's error as it is", err)
	}
	if _, ok := k.get(pfB); !ok || pruned != nil {
		t.Fatalf("a prune whose listing failed deleted %v", pruned)
	}

	k.failLs = nil
	k.failDel[pfB] = errors.New("busy")
	ops.Entry = ""
	if err := ops.Prune(context.Background(), nil, objsOf()); err == nil || err.Error() != "prune 10.0.1.0/24: busy" {
		t.Fatalf("prune returned %v, want the prefix alone named", err)
	}
}

func TestListPrefixes(t *testing.T) {
	ps := []netip.Prefix{pfB, pfA}
	list := ListPrefixes("the test map", func() ([]netip.Prefix, error) { return ps, nil })
	seq, err := list()
	if err != nil {
		t.Fatal(err)
	}
	var got []netip.Prefix
	for p, attrs := range seq {
		if attrs != nil {
			t.Fatalf("%s listed with log fields %v", p, attrs)
		}
		got = append(got, p)
	}
	if !slices.Equal(got, ps) {
		t.Fatalf("listed %v, want %v", got, ps)
	}
	noMap := errors.New("no map")
	_, err = ListPrefixes("the test map", func() ([]netip.Prefix, error) { return nil, noMap })()
	if !errors.Is(err, noMap) || !strings.HasPrefix(err.Error(), "list the test map: ") {
		t.Fatalf("failed listing returned %v, want it wrapped with what was listed", err)
	}
}

// TestPrefixOpsReconciler runs PrefixOps under statedb's reconciler (a
// real table and reconciler, the fake kernel): an object is written and
// marked done, a failed put marks it failed and is retried until the
// kernel takes it, a deleted object's prefix goes, and the prune removes
// what the kernel held before and no object backs.
func TestPrefixOpsReconciler(t *testing.T) {
	k := newFakeKernel(t)
	stale := netip.MustParsePrefix("10.9.0.0/16")
	if err := k.put(stale, "previous run"); err != nil {
		t.Fatal(err)
	}
	busy := errors.New("busy")
	k.setFailPut(pfB, busy)
	var (
		db          *statedb.DB
		tbl         statedb.RWTable[*obj]
		initialized func(statedb.WriteTxn)
	)
	var mu sync.Mutex
	var pruned []Stale
	reconciletest.Start(t, "prefixops-test", func(d reconciletest.Deps) error {
		var err error
		db = d.DB
		tbl, err = statedb.NewTable(d.DB, "prefixops-test", objIndex)
		if err != nil {
			return err
		}
		wtxn := d.DB.WriteTxn(tbl)
		initialized = tbl.RegisterInitializer(wtxn, "test")
		wtxn.Commit()
		ops := k.ops(nil)
		ops.Pruned = func(gone []Stale) { mu.Lock(); pruned = append(pruned, gone...); mu.Unlock() }
		_, err = reconciler.Register(reconciler.Params{Log: d.Log, DB: d.DB, JobGroup: d.Jobs, ModuleID: d.ModuleID}, tbl,
			func(o *obj) *obj { c := *o; return &c },
			func(o *obj, s reconciler.Status) *obj { o.Status = s; return o },
			func(o *obj) reconciler.Status { return o.Status },
			ops, nil,
			reconciler.WithPruning(time.Hour), reconciler.WithRetry(10*time.Millisecond, 50*time.Millisecond))
		return err
	})
	wtxn := db.WriteTxn(tbl)
	for _, o := range []*obj{{Prefix: pfA, Value: "a"}, {Prefix: pfB, Value: "b"}} {
		o.Status = reconciler.StatusPending()
		if _, _, err := tbl.Insert(wtxn, o); err != nil {
			t.Fatal(err)
		}
	}
	wtxn.Commit()
	status := func(p netip.Prefix) reconciler.Status {
		o, _, _ := tbl.Get(db.ReadTxn(), objIndex.Query(p))
		return o.Status
	}
	testutil.Eventually(t, 10*time.Second, "A written and done, B failed", func() bool {
		return status(pfA).Kind == reconciler.StatusKindDone && status(pfB).Kind == reconciler.StatusKindError
	})
	if v, ok := k.get(pfA); !ok || v != "a" {
		t.Fatalf("%s holds %q %v, want a", pfA, v, ok)
	}
	if got := status(pfB).GetError(); got != busy.Error() {
		t.Fatalf("B's status error %q, want the kernel's %q", got, busy)
	}
	k.setFailPut(pfB, nil)
	testutil.Eventually(t, 10*time.Second, "B written at a retry", func() bool {
		v, ok := k.get(pfB)
		return ok && v == "b" && status(pfB).Kind == reconciler.StatusKindDone
	})
	if _, ok := k.get(stale); !ok {
		t.Fatal("stale entry pruned before the table was initialized")
	}

	// The reconciler prunes once the table is initialized.
	wtxn = db.WriteTxn(tbl)
	initialized(wtxn)
	wtxn.Commit()
	testutil.Eventually(t, 10*time.Second, "the prune of the stale entry", func() bool {
		mu.Lock()
		defer mu.Unlock()
		_, ok := k.get(stale)
		return !ok && len(pruned) == 1 && pruned[0].Prefix == stale
	})
	for _, p := range []netip.Prefix{pfA, pfB} {
		if _, ok := k.get(p); !ok {
			t.Fatalf("the prune deleted %s, which the table has", p)
		}
	}

	wtxn = db.WriteTxn(tbl)
	if _, _, err := tbl.Delete(wtxn, &obj{Prefix: pfA}); err != nil {
		t.Fatal(err)
	}
	wtxn.Commit()
	testutil.Eventually(t, 10*time.Second, "A's prefix deleted", func() bool { _, ok := k.get(pfA); return !ok })
	if v, ok := k.get(pfB); !ok || v != "b" {
		t.Fatalf("the delete of A took B with it (%q %v)", v, ok)
	}
}
