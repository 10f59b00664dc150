package observer

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"

	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

// newTestObserver holds n UDP flows with destination ports 1..n, flow i
// at base+i seconds; even ports are drops.
func newTestObserver(t *testing.T, capacity, n int) *Observer {
	t.Helper()
	o := New(Config{Capacity: capacity, Clock: fixedClock}, fakeNode{}, nil)
	for i := 1; i <= n; i++ {
		o.observeTest(t, i)
	}
	return o
}

func (o *Observer) observeTest(t *testing.T, i int) {
	t.Helper()
	ev := traceEvent(webIP, dbIP, 17, 5000, uint16(i), 0, maps.DirEgress, maps.ReasonForwarded, time.Duration(i)*time.Second)
	if i%2 == 0 {
		ev = dropEvent(webIP, dbIP, uint16(i), maps.ReasonPolicyDenied, time.Duration(i)*time.Second)
	}
	if err := o.Observe(ev); err != nil {
		t.Fatal(err)
	}
}

func port(f *flowpb.Flow) int {
	_, d, _ := ports(f)
	return int(d)
}

func collect(t *testing.T, o *Observer, q Query) ([]int, uint64) {
	t.Helper()
	var got []int
	var lost uint64
	err := o.Flows(context.Background(), q, func(f *flowpb.Flow) error { got = append(got, port(f)); return nil },
		func(n uint64) error { lost += n; return nil })
	if err != nil {
		t.Fatal(err)
	}
	return got, lost
}

func TestRingKeepsTheLastFlows(t *testing.T) {
	o := newTestObserver(t, 5, 12)
	r := o.Ring()
	if r.Len() != 5 || r.Cap() != 5 || r.Seen() != 12 {
		t.Fatalf("len %d cap %d seen %d", r.Len(), r.Cap(), r.Seen())
	}
	if _, ok := r.At(6); ok {
		t.Error("an overwritten flow is still readable")
	}
	if f, ok := r.At(7); !ok || port(f) != 8 {
		t.Errorf("oldest held flow: %v", f)
	}
	if NewRing(0).Cap() != DefaultRingCapacity {
		t.Error("default capacity")
	}
}

func TestFlowsQuerySemantics(t *testing.T) {
	o := newTestObserver(t, 100, 10)
	drops, err := CompileFilters([]*flowpb.FlowFilter{{Verdict: []flowpb.Verdict{flowpb.Verdict_DROPPED}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		q    Query
		want []int
	}{
		{"all", Query{}, []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}},
		{"last 3", Query{Number: 3}, []int{8, 9, 10}},
		{"first 3", Query{Number: 3, First: true}, []int{1, 2, 3}},
		{"last 2 drops", Query{Number: 2, Filters: drops}, []int{8, 10}},
		{"first 2 drops", Query{Number: 2, First: true, Filters: drops}, []int{2, 4}},
		{"since", Query{Since: base.Add(8 * time.Second)}, []int{8, 9, 10}},
		{"until", Query{Until: base.Add(3 * time.Second)}, []int{1, 2, 3}},
		{"since and until", Query{Since: base.Add(4 * time.Second), Until: base.Add(6 * time.Second)}, []int{4, 5, 6}},
		{"last 2 until", Query{Number: 2, Until: base.Add(6 * time.Second)}, []int{5, 6}},
		{"more than held", Query{Number: 50}, []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, _ := collect(t, o, c.q)
			if len(got) != len(c.want) {
				t.Fatalf("got %v, want %v", got, c.want)
			}
			for i := range got {
				if got[i] != c.want[i] {
					t.Fatalf("got %v, want %v", got, c.want)
				}
			}
		})
	}
}

func TestFlowsFollow(t *testing.T) {
	o := newTestObserver(t, 100, 4)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan int, 100)
	var wg sync.WaitGroup
	wg.Add(1)
	var err error
	go func() {
		defer wg.Done()
		err = o.Flows(ctx, Query{Number: 2, Follow: true}, func(f *flowpb.Flow) error { got <- port(f); return nil },
			func(uint64) error { return nil })
	}()
	for _, want := range []int{3, 4} {
		if p := <-got; p != want {
			t.Fatalf("got %d, want %d", p, want)
		}
	}
	// Each flow comes out before the next is made: followed as it
	// happens. (The deadline only ends a follow that never delivers.)
	for i := 5; i <= 7; i++ {
		o.observeTest(t, i)
		select {
		case p := <-got:
			if p != i {
				t.Fatalf("followed %d, want %d", p, i)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("flow %d never followed", i)
		}
	}
	cancel()
	wg.Wait()
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("follow ended with %v", err)
	}

}

func TestFlowsFollowFromNowUntil(t *testing.T) {
	o := newTestObserver(t, 100, 4)
	done := make(chan error, 1)
	got := make(chan int, 100)
	go func() {
		done <- o.Flows(context.Background(), Query{Follow: true, Until: base.Add(6 * time.Second)},
			func(f *flowpb.Flow) error { got <- port(f); return nil }, func(uint64) error { return nil })
	}()
	time.Sleep(50 * time.Millisecond)
	for i := 5; i <= 8; i++ {
		o.observeTest(t, i)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrUntilPassed) {
			t.Fatalf("ended with %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("follow did not stop at its until time")
	}
	close(got)
	var ports []int
	for p := range got {
		ports = append(ports, p)
	}
	if len(ports) != 2 || ports[0] != 5 || ports[1] != 6 {
		t.Fatalf("followed %v, want [5 6] (nothing from before the call)", ports)
	}
}

func TestFlowsReportsWhatTheRingOverwrote(t *testing.T) {
	o := newTestObserver(t, 4, 4)
	var lost uint64
	var got []int
	first := true
	err := o.Flows(context.Background(), Query{}, func(f *flowpb.Flow) error {
		got = append(got, port(f))
		if first {
			// While the reader is at its first flow, six more arrive:
			// the ring (4) keeps 7..10, so 2..6 are lost to it.
			first = false
			for i := 5; i <= 10; i++ {
				o.observeTest(t, i)
			}
		}
		return nil
	}, func(n uint64) error { lost += n; return nil })
	if err != nil {
		t.Fatal(err)
	}
	if lost != 5 || len(got) != 5 || got[0] != 1 || got[1] != 7 || got[4] != 10 {
		t.Fatalf("got %v lost %d, want [1 7 8 9 10] with 5 lost", got, lost)
	}
}

// fakeSource replays events then blocks until closed.
type fakeSource struct {
	evs    chan loader.Event
	closed chan struct{}
	once   sync.Once
}

func (s *fakeSource) Read() (loader.Event, error) {
	select {
	case ev := <-s.evs:
		return ev, nil
	case <-s.closed:
		return loader.Event{}, errors.New("closed")
	}
}

func (s *fakeSource) Close() error { s.once.Do(func() { close(s.closed) }); return nil }

func TestRunFeedsTheRingAndStops(t *testing.T) {
	o := New(Config{Clock: fixedClock}, fakeNode{}, nil)
	src := &fakeSource{evs: make(chan loader.Event, 3), closed: make(chan struct{})}
	src.evs <- dropEvent(webIP, dbIP, 1, maps.ReasonPolicyDenied, 0)
	src.evs <- loader.Event{Type: 42}
	src.evs <- dropEvent(webIP, dbIP, 2, maps.ReasonPolicyDenied, 0)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- o.Run(ctx, src) }()
	deadline := time.Now().Add(2 * time.Second)
	for o.Ring().Seen() < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if o.Ring().Seen() != 2 || o.DecodeErrors() != 1 {
		t.Fatalf("seen %d, decode errors %d", o.Ring().Seen(), o.DecodeErrors())
	}
}

// The ring's wake channel: open until the next write after Bounds handed
// it out, closed by that write, and a fresh open one from the next Bounds.
func TestRingWakesAtTheNextWrite(t *testing.T) {
	r := NewRing(4)
	closed := func(c <-chan struct{}) bool {
		select {
		case <-c:
			return true
		default:
			return false
		}
	}
	r.Write(&flowpb.Flow{}) // nobody waits: no channel to close
	_, _, w1 := r.Bounds()
	_, _, w2 := r.Bounds()
	if closed(w1) || w1 != w2 {
		t.Fatal("Bounds before a write: want one open channel")
	}
	r.Write(&flowpb.Flow{})
	if !closed(w1) {
		t.Fatal("the write did not close the channel Bounds handed out")
	}
	r.Write(&flowpb.Flow{}) // no new waiter: nothing to close twice
	_, next, w3 := r.Bounds()
	if closed(w3) || next != 3 {
		t.Fatalf("after the writes: next %d, channel closed %v", next, closed(w3))
	}
	r.Write(&flowpb.Flow{})
	if !closed(w3) {
		t.Fatal("the next write did not close the new channel")
	}
}
