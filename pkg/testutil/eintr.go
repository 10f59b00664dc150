package testutil

import (
	"errors"

	"golang.org/x/sys/unix"
)

// RetryEINTR calls f again for as long as it fails with EINTR. A blocking
// socket call on a socket with SO_RCVTIMEO or SO_SNDTIMEO is not restarted
// after a signal handler ran (signal(7)), and the Go runtime signals its
// own threads (SIGURG for preemption), so a test's raw read can fail with
// EINTR while nothing is wrong with what it probes.
func RetryEINTR[T any](f func() (T, error)) (T, error) {
	for {
		v, err := f()
		if !errors.Is(err, unix.EINTR) {
			return v, err
		}
	}
}
