package kvstore

import (
	"context"
	"math/rand/v2"
	"time"
)

// backoff spaces out retries: the delay doubles from min up to max, with
// up to 20% random jitter so that many agents retrying after one etcd
// outage do not arrive in lockstep.
type backoff struct {
	min, max time.Duration
	next     time.Duration
}

func newBackoff(min, max time.Duration) *backoff {
	return &backoff{min: min, max: max, next: min}
}

// wait sleeps for the next delay or until ctx ends (then returns its error).
func (b *backoff) wait(ctx context.Context) error {
	d := b.next
	d += time.Duration(rand.Int64N(int64(d)/5 + 1))
	b.next = min(b.next*2, b.max)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// reset starts over from min after a success.
func (b *backoff) reset() { b.next = b.min }
