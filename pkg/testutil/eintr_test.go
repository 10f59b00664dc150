package testutil

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

func TestRetryEINTR(t *testing.T) {
	calls := 0
	v, err := RetryEINTR(func() (int, error) {
		calls++
		if calls < 3 {
			return 0, unix.EINTR
		}
		return 7, nil
	})
	if v != 7 || err != nil || calls != 3 {
		t.Fatalf("got %d, %v after %d calls; want 7, nil after 3", v, err, calls)
	}
	// Any other error is returned at once.
	calls = 0
	_, err = RetryEINTR(func() (int, error) { calls++; return 0, unix.ECONNRESET })
	if !errors.Is(err, unix.ECONNRESET) || calls != 1 {
		t.Fatalf("got %v after %d calls; want ECONNRESET after 1", err, calls)
	}
}
