package endpointmanager

import (
	"slices"
	"sync"
	"testing"
)

// TestClaimsRollback: claims are given back newest first (an endpoint
// leaves the table before its addresses go back, so no other Create can
// take an address a listed endpoint still has); an undo of the manager's
// state runs under the lock, taken for it when not held; the others run as
// the lock is; and after keep or handOver only what remains is undone.
func TestClaimsRollback(t *testing.T) {
	type call struct {
		name string
		held bool
	}
	var mu sync.Mutex
	var calls []call
	record := func(name string) func() {
		return func() {
			held := !mu.TryLock()
			if !held {
				mu.Unlock()
			}
			calls = append(calls, call{name, held})
		}
	}
	check := func(want ...call) {
		t.Helper()
		if !slices.Equal(calls, want) {
			t.Errorf("undone %v, want %v", calls, want)
		}
		calls = nil
	}

	// Failure after the lock was dropped (a state write).
	c := claims{mu: &mu}
	c.lock()
	c.add(record("addresses"))
	c.addLocked(record("table entry"))
	c.unlock()
	c.rollback()
	check(call{"table entry", true}, call{"addresses", false})
	if !mu.TryLock() {
		t.Fatal("rollback left the lock held")
	}
	mu.Unlock()

	// Failure under the lock: everything is undone under it, and it stays
	// held for the caller to drop.
	c = claims{mu: &mu}
	c.lock()
	c.add(record("first address"))
	c.add(record("second address"))
	c.addLocked(record("table entry"))
	c.rollback()
	check(call{"table entry", true}, call{"second address", true}, call{"first address", true})
	if !c.held || mu.TryLock() {
		t.Fatal("rollback under the lock dropped it")
	}
	c.unlock()

	// Handed over: one undo instead of all; kept: none; a second rollback
	// undoes nothing again.
	c = claims{mu: &mu}
	c.add(record("addresses"))
	c.addLocked(record("table entry"))
	c.handOver(record("delete"))
	c.rollback()
	c.rollback()
	check(call{"delete", false})
	c.add(record("addresses"))
	c.keep()
	c.rollback()
	check()
}
