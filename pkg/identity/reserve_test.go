package identity

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// fakeStore records what Reserve asks of a store.
type fakeStore struct {
	give       NumericIdentity // what Acquire returns (0: the asked id)
	acquireErr error
	releaseErr error
	acquired   [][]string
	released   []NumericIdentity
}

func (f *fakeStore) Acquire(id NumericIdentity, labels []string) (NumericIdentity, error) {
	f.acquired = append(f.acquired, labels)
	if f.acquireErr != nil {
		return 0, f.acquireErr
	}
	if f.give != 0 {
		return f.give, nil
	}
	return id, nil
}

func (f *fakeStore) Release(id NumericIdentity) error {
	f.released = append(f.released, id)
	return f.releaseErr
}

func TestReserveTakesTheAskedNumber(t *testing.T) {
	s := &fakeStore{}
	if err := Reserve(s, MinCluster+7, []string{"k8s:b=2", "k8s:a=1"}); err != nil {
		t.Fatal(err)
	}
	// The store gets the labels sorted, once, and nothing is released.
	if want := [][]string{{"k8s:a=1", "k8s:b=2"}}; !reflect.DeepEqual(s.acquired, want) {
		t.Fatalf("acquired %v, want %v", s.acquired, want)
	}
	if len(s.released) != 0 {
		t.Fatalf("released %v after a successful reserve", s.released)
	}
}

func TestReserveRejectsBadInputBeforeTheStore(t *testing.T) {
	for _, tc := range []struct {
		name   string
		id     NumericIdentity
		labels []string
		want   string
	}{
		{"reserved number", Host, []string{"k8s:a=1"}, "not in the cluster range"},
		{"zero", 0, []string{"k8s:a=1"}, "not in the cluster range"},
		{"above the range", MaxCluster + 1, []string{"k8s:a=1"}, "not in the cluster range"},
		{"local number", LocalScope | 5, []string{"k8s:a=1"}, "not in the cluster range"},
		{"no labels", MinCluster, nil, "empty label set"},
		{"separator in a label", MinCluster, []string{"k8s:a=1;k8s:b=2"}, "reserve identity 256"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &fakeStore{}
			err := Reserve(s, tc.id, tc.labels)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
			if len(s.acquired) != 0 {
				t.Fatalf("the store was asked for %v", s.acquired)
			}
		})
	}
}

func TestReserveOtherNumberIsAConflictAndHoldsNothing(t *testing.T) {
	s := &fakeStore{give: MinCluster + 9}
	err := Reserve(s, MinCluster+7, []string{"k8s:a=1"})
	if !errors.Is(err, ErrReserveConflict) || !strings.Contains(err.Error(), "labels already have identity 265") {
		t.Fatalf("err = %v, want a conflict naming 265", err)
	}
	if want := []NumericIdentity{MinCluster + 9}; !reflect.DeepEqual(s.released, want) {
		t.Fatalf("released %v, want %v (the reference Acquire took)", s.released, want)
	}
}

func TestReserveReportsAFailedRelease(t *testing.T) {
	boom := errors.New("store down")
	s := &fakeStore{give: MinCluster + 9, releaseErr: boom}
	err := Reserve(s, MinCluster+7, []string{"k8s:a=1"})
	if !errors.Is(err, ErrReserveConflict) || !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the conflict and the release error", err)
	}
}

func TestReserveStoreErrorIsWrappedAndNotReleased(t *testing.T) {
	boom := errors.New("store down")
	s := &fakeStore{acquireErr: boom}
	err := Reserve(s, MinCluster+7, []string{"k8s:a=1"})
	if !errors.Is(err, boom) || errors.Is(err, ErrReserveConflict) || !strings.Contains(err.Error(), "reserve identity 263") {
		t.Fatalf("err = %v, want the store's error with the number", err)
	}
	if len(s.released) != 0 {
		t.Fatalf("released %v after a failed Acquire", s.released)
	}
}

// fakeAllocator is a cluster allocator whose store chose number for the
// labels.
type fakeAllocator struct {
	number   NumericIdentity
	refs     int
	released []NumericIdentity
}

func (f *fakeAllocator) Allocate(labels []string) (Identity, bool, error) {
	f.refs++
	return Identity{ID: f.number, Labels: labels, RefCount: f.refs}, false, nil
}

func (f *fakeAllocator) Release(id NumericIdentity) error {
	f.refs--
	f.released = append(f.released, id)
	return nil
}

func TestReserveByAllocating(t *testing.T) {
	a := &fakeAllocator{number: MinCluster + 3}
	if err := ReserveByAllocating(a, MinCluster+3, []string{"k8s:a=1"}); err != nil || a.refs != 1 {
		t.Fatalf("err = %v, refs = %d; want the reference kept", err, a.refs)
	}
	err := ReserveByAllocating(a, MinCluster+4, []string{"k8s:a=1"})
	if !errors.Is(err, ErrReserveConflict) || a.refs != 1 || !reflect.DeepEqual(a.released, []NumericIdentity{MinCluster + 3}) {
		t.Fatalf("err = %v, refs = %d, released %v; want a conflict and the extra reference dropped", err, a.refs, a.released)
	}
}

func TestLocalAllocatorReserve(t *testing.T) {
	a := NewLocalAllocator()
	var refEvents []NumericIdentity
	a.SubscribeReferences(func(id NumericIdentity) { refEvents = append(refEvents, id) })
	web := []string{"k8s:app=web"}
	if err := a.Reserve(MinCluster+100, web); err != nil {
		t.Fatal(err)
	}
	if got, ok := a.Lookup(MinCluster + 100); !ok || got.RefCount != 1 || LabelsKey(got.Labels) != LabelsKey(web) {
		t.Fatalf("reserved identity = %+v, %v", got, ok)
	}
	// The same number again: a second reference.
	if err := a.Reserve(MinCluster+100, web); err != nil {
		t.Fatal(err)
	}
	events := len(refEvents)
	if events != 2 {
		t.Fatalf("reference subscribers told %d times, want 2", events)
	}
	// The labels under another number, or the number for other labels:
	// conflicts that change nothing and tell nobody.
	if err := a.Reserve(MinCluster+101, web); !errors.Is(err, ErrReserveConflict) {
		t.Fatalf("labels under another number: err = %v", err)
	}
	if err := a.Reserve(MinCluster+100, []string{"k8s:app=db"}); !errors.Is(err, ErrReserveConflict) {
		t.Fatalf("number of other labels: err = %v", err)
	}
	if got, _ := a.Lookup(MinCluster + 100); got.RefCount != 2 {
		t.Fatalf("refs after conflicts = %d, want 2", got.RefCount)
	}
	if _, ok := a.Lookup(MinCluster + 101); ok || len(refEvents) != events {
		t.Fatalf("a conflict left identity 357 (%v) or told subscribers (%d events)", ok, len(refEvents)-events)
	}
	if err := a.Reserve(Health, []string{"k8s:app=x"}); err == nil {
		t.Fatal("reserved a reserved-range number")
	}
}
