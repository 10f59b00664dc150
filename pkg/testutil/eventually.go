package testutil

import (
	"testing"
	"time"
)

// Eventually polls cond every 5 ms until it holds, and fails the test
// naming what it waited for once timeout has passed: for state a
// reconciler or a watch reaches asynchronously (the deadline only bounds
// a broken one).
func Eventually(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
