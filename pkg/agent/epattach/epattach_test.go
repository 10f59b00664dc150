package epattach_test

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/statedb/reconciler"
	"golang.org/x/time/rate"

	"github.com/tendril-net/tendril/pkg/agent/epattach"
	"github.com/tendril-net/tendril/pkg/agent/epattach/epattachtest"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// fakeKernel records attached endpoints and map entries by ID; attaches
// fail while failAttach is above zero (counting down).
type fakeKernel struct {
	mu         sync.Mutex
	attached   map[uint16]loader.EndpointInfo
	mapOnly    map[uint16]bool // map entries without programs (a leftover)
	failAttach int
	attaches   int
	purged     []uint16
	// removed are endpoints whose programs someone else took off: an
	// attach does not see it (the loader's cheap path), a check does.
	removed map[uint16]bool
	checks  int
	// failDetach fails detaches while true.
	failDetach bool
}

func newFakeKernel() *fakeKernel {
	return &fakeKernel{attached: map[uint16]loader.EndpointInfo{}, mapOnly: map[uint16]bool{}, removed: map[uint16]bool{}}
}

func (k *fakeKernel) CheckEndpoint(ep loader.EndpointInfo) (bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.checks++
	k.attached[ep.ID] = ep
	gone := k.removed[ep.ID]
	delete(k.removed, ep.ID)
	return gone, nil
}

func (k *fakeKernel) removePrograms(id uint16) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.removed[id] = true
}

func (k *fakeKernel) checked() (checks int, removed int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.checks, len(k.removed)
}

func (k *fakeKernel) AttachEndpoint(ep loader.EndpointInfo) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.attaches++
	if k.failAttach > 0 {
		k.failAttach--
		return errors.New("attach TCX ingress to interface 7: device or resource busy")
	}
	k.attached[ep.ID] = ep
	return nil
}

func (k *fakeKernel) DetachEndpoint(id uint16, _ []netip.Addr) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.failDetach {
		return errors.New("detach TCX ingress of interface 7: operation not permitted")
	}
	delete(k.attached, id)
	delete(k.mapOnly, id)
	return nil
}

func (k *fakeKernel) AttachedEndpoints() []uint16 {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []uint16
	for id := range k.attached {
		out = append(out, id)
	}
	return out
}

func (k *fakeKernel) EndpointIDs() ([]uint16, error) {
	out := k.AttachedEndpoints()
	k.mu.Lock()
	defer k.mu.Unlock()
	for id := range k.mapOnly {
		out = append(out, id)
	}
	return out, nil
}

func (k *fakeKernel) PurgeEndpoint(id uint16) (bool, error) {
	k.mu.Lock()
	k.purged = append(k.purged, id)
	k.mu.Unlock()
	return false, k.DetachEndpoint(id, nil)
}

func (k *fakeKernel) state() (attaches int, attached map[uint16]loader.EndpointInfo, purged []uint16) {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := map[uint16]loader.EndpointInfo{}
	for id, ep := range k.attached {
		out[id] = ep
	}
	return k.attaches, out, slices.Clone(k.purged)
}

var fastRetry = reconciler.WithRetry(10*time.Millisecond, 50*time.Millisecond)

func info(id uint16, ifindex int) loader.EndpointInfo {
	return loader.EndpointInfo{ID: id, IfIndex: ifindex, IfName: "tdr" + string(rune('a'+id)), Addresses: []netip.Addr{netip.AddrFrom4([4]byte{10, 0, 0, byte(id)})}, Identity: 1000}
}

// TestFailedAttachIsRetried: the kernel refuses the first three attaches.
// The regeneration's wait returns the error (the object's status says
// it), and the reconciler retries with backoff until the attach succeeds,
// with no other write to the table.
func TestFailedAttachIsRetried(t *testing.T) {
	k := newFakeKernel()
	k.failAttach = 3
	tbl := epattachtest.Start(t, k, fastRetry)
	if err := tbl.Upsert(info(5, 7), "default", "web"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := tbl.WaitRealized(ctx, 5)
	if err == nil || !strings.Contains(err.Error(), "device or resource busy") {
		t.Fatalf("wait for a failing attach: %v, want the attach's error", err)
	}
	obj, _ := tbl.Get(5)
	if obj.Status.Kind != reconciler.StatusKindError || !strings.Contains(obj.Status.GetError(), "attach endpoint 5") {
		t.Fatalf("status after a failed attach: %s", obj.Status)
	}
	testutil.Eventually(t, 10*time.Second, "the attach to be retried until it succeeds", func() bool {
		obj, _ := tbl.Get(5)
		return obj.Status.Kind == reconciler.StatusKindDone
	})
	if err := tbl.WaitRealized(ctx, 5); err != nil {
		t.Fatal(err)
	}
	attaches, attached, _ := k.state()
	if attaches != 4 || attached[5].IfIndex != 7 {
		t.Fatalf("%d attaches, attached %v: want 3 failures and one success", attaches, attached)
	}
}

// TestCheckPutsBackRemovedPrograms: the periodic check (a refresh of the
// reconciler) checks every endpoint in the kernel; the one whose programs
// someone removed gets them back and is counted once, the others are
// left as they are, and regenerations still take the cheap path.
func TestCheckPutsBackRemovedPrograms(t *testing.T) {
	k := newFakeKernel()
	tbl := epattachtest.Start(t, k, fastRetry, reconciler.WithRefreshing(20*time.Millisecond, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, id := range []uint16{1, 2, 3} {
		if err := tbl.Upsert(info(id, 10+int(id)), "default", "web"); err != nil {
			t.Fatal(err)
		}
		if err := tbl.WaitRealized(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	k.removePrograms(2)
	testutil.Eventually(t, 10*time.Second, "the check to put endpoint 2's programs back", func() bool {
		_, removed := k.checked()
		return removed == 0 && tbl.Reattached() == 1
	})
	// Further rounds of checks find nothing more.
	checks, _ := k.checked()
	testutil.Eventually(t, 10*time.Second, "three more rounds of checks", func() bool {
		n, _ := k.checked()
		return n >= checks+9
	})
	if n := tbl.Reattached(); n != 1 {
		t.Errorf("%d reattaches counted, want 1", n)
	}
	attaches, _, _ := k.state()
	if attaches != 3 {
		t.Errorf("%d attaches, want the 3 first ones (checks are not attaches)", attaches)
	}
	for _, id := range []uint16{1, 2, 3} {
		if err := tbl.WaitRealized(ctx, id); err != nil {
			t.Errorf("endpoint %d after the checks: %v", id, err)
		}
	}
}

// TestFailedDetachIsCounted: a detach that fails is returned to the
// deleter and, its row gone, still counted as an error of the table until
// the reconciler's retry succeeds.
func TestFailedDetachIsCounted(t *testing.T) {
	k := newFakeKernel()
	tbl := epattachtest.Start(t, k, fastRetry)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tbl.Upsert(info(5, 7), "default", "web"); err != nil {
		t.Fatal(err)
	}
	if err := tbl.WaitRealized(ctx, 5); err != nil {
		t.Fatal(err)
	}
	k.mu.Lock()
	k.failDetach = true
	k.mu.Unlock()
	if err := tbl.Delete(ctx, 5); err == nil || !strings.Contains(err.Error(), "operation not permitted") {
		t.Fatalf("delete with a failing detach: %v", err)
	}
	r := tbl.Realization(tbl.ReadTxn())
	if r.Objects != 0 || r.Errors != 1 || !strings.Contains(r.LastError, "detach endpoint 5") {
		t.Fatalf("realization after a failed detach: %+v", r)
	}
	k.mu.Lock()
	k.failDetach = false
	k.mu.Unlock()
	testutil.Eventually(t, 10*time.Second, "the detach to be retried until it succeeds", func() bool {
		return tbl.Realization(tbl.ReadTxn()).Errors == 0
	})
	if _, attached, _ := k.state(); len(attached) != 0 {
		t.Errorf("still attached after the retried detach: %v", attached)
	}
}

// TestUnchangedEndpointIsNotWrittenAgain: a regeneration that wants what
// the kernel holds costs no kernel write; a change of flags is written.
func TestUnchangedEndpointIsNotWrittenAgain(t *testing.T) {
	k := newFakeKernel()
	tbl := epattachtest.Start(t, k, fastRetry)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ep := info(5, 7)
	for range 3 {
		if err := tbl.Upsert(ep, "default", "web"); err != nil {
			t.Fatal(err)
		}
		if err := tbl.WaitRealized(ctx, 5); err != nil {
			t.Fatal(err)
		}
	}
	ep.EnforceIngress = true
	if err := tbl.Upsert(ep, "default", "web"); err != nil {
		t.Fatal(err)
	}
	if err := tbl.WaitRealized(ctx, 5); err != nil {
		t.Fatal(err)
	}
	attaches, attached, _ := k.state()
	if attaches != 2 || !attached[5].EnforceIngress {
		t.Fatalf("%d attaches (want 2: the first and the flags' change), kernel holds %+v", attaches, attached[5])
	}
}

// TestPruneWaitsForRestore: the kernel holds an attached endpoint (ID 9)
// and map entries (ID 8) of a previous run that no object backs, and a
// restored endpoint (ID 3) put in the table as the previous run left it.
// Nothing is pruned before MarkRestored (a prune asked for earlier does
// nothing); after it, 8 and 9 go, the restored endpoint stays and is not
// written, and a deleted endpoint is detached.
func TestPruneWaitsForRestore(t *testing.T) {
	k := newFakeKernel()
	k.attached[3] = info(3, 30)
	k.attached[9] = info(9, 90)
	k.mapOnly[8] = true
	tbl := epattachtest.Start(t, k, fastRetry)
	if err := tbl.AddRestored([]epattach.Endpoint{{EndpointInfo: info(3, 30), Namespace: "default", Pod: "db"}}); err != nil {
		t.Fatal(err)
	}
	if err := tbl.Upsert(info(5, 7), "default", "web"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tbl.WaitRealized(ctx, 5); err != nil {
		t.Fatal(err)
	}
	tbl.Prune()
	time.Sleep(200 * time.Millisecond)
	if _, _, purged := k.state(); len(purged) != 0 {
		t.Fatalf("pruned %v before the restored endpoints were in", purged)
	}
	tbl.MarkRestored()
	testutil.Eventually(t, 10*time.Second, "the prune", func() bool { _, _, purged := k.state(); return len(purged) == 2 })
	attaches, attached, purged := k.state()
	slices.Sort(purged)
	if !slices.Equal(purged, []uint16{8, 9}) {
		t.Fatalf("pruned %v, want [8 9]", purged)
	}
	if _, ok := attached[3]; !ok || attaches != 1 {
		t.Fatalf("restored endpoint: attached %v after %d attaches (want it kept, and only endpoint 5 attached)", attached, attaches)
	}
	if err := tbl.Delete(ctx, 5); err != nil {
		t.Fatal(err)
	}
	if _, attached, _ := k.state(); len(attached) != 1 {
		t.Fatalf("after the delete of endpoint 5 the kernel holds %v", attached)
	}
}

// BenchmarkUpsertWaitRealized: what a regeneration pays for its
// endpoint's attachment beyond the kernel's work: the object written,
// the reconciler's round (over a kernel that does nothing) and the wait
// for its status; one new endpoint per iteration, as serial CNI ADDs
// make them. "statedb-rounds" runs the reconciler with statedb's default
// round limits (a round at most every millisecond, 1,000 objects), for
// comparison.
func BenchmarkUpsertWaitRealized(b *testing.B) {
	for _, c := range []struct {
		name string
		opts []reconciler.Option
	}{
		{"endpoints-table", nil},
		{"statedb-rounds", []reconciler.Option{reconciler.WithRoundLimits(1000, rate.NewLimiter(1000, 1))}},
	} {
		b.Run(c.name, func(b *testing.B) {
			tbl := epattachtest.Start(b, newFakeKernel(), append([]reconciler.Option{fastRetry}, c.opts...)...)
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				id := uint16(1 + i%60000)
				if err := tbl.Upsert(info(id, 1000+i), "default", "web"); err != nil {
					b.Fatal(err)
				}
				if err := tbl.WaitRealized(ctx, id); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
