package ui

import (
	"testing"

	flowpb "github.com/cilium/cilium/api/v1/flow"
)

// TestSubscribeFromCursor: a subscription from a snapshot's cursor gets
// the flows added after the snapshot, in order and once; flows of its
// range the ring overwrote are counted as skipped; a cursor of another
// store starts at the live end, and a malformed one is refused.
func TestSubscribeFromCursor(t *testing.T) {
	s := NewStore(4)
	add := func(from, to int) {
		for i := from; i < to; i++ {
			s.Add(&flowpb.Flow{NodeName: "n", Uuid: string(rune('a' + i))})
		}
	}
	add(0, 2)
	held, cursor := s.Snapshot(nil)
	if len(held) != 2 {
		t.Fatalf("snapshot of %d flows", len(held))
	}
	add(2, 4)
	sub, err := s.Subscribe(nil, 10, cursor)
	if err != nil {
		t.Fatal(err)
	}
	add(4, 5)
	var got string
	for range 3 {
		e := <-sub.C
		got += e.Flow.GetUuid()
	}
	if got != "cde" || len(sub.C) != 0 {
		t.Fatalf("subscription from the cursor got %q (+%d), want cde", got, len(sub.C))
	}
	s.Unsubscribe(sub)

	// Six more: the ring of four no longer holds the first two after the
	// cursor of position 5.
	_, at5 := s.Snapshot(nil)
	add(5, 11)
	late, err := s.Subscribe(nil, 10, at5)
	if err != nil {
		t.Fatal(err)
	}
	if skipped, _, _ := s.Progress(late); skipped != 2 || len(late.C) != 4 || late.From != 7 {
		t.Fatalf("late subscription: skipped %d, %d queued, from %d; want 2, 4, 7", skipped, len(late.C), late.From)
	}
	s.Unsubscribe(late)

	other, err := s.Subscribe(nil, 10, NewStore(4).Cursor(3))
	if err != nil {
		t.Fatal(err)
	}
	if len(other.C) != 0 || other.From != 11 {
		t.Fatalf("another store's cursor: %d queued, from %d; want none, from 11", len(other.C), other.From)
	}
	for _, bad := range []string{"yesterday", "-3", "ab-x"} {
		if _, err := s.Subscribe(nil, 10, bad); err == nil {
			t.Errorf("cursor %q accepted", bad)
		}
	}
}
