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

// delay returns the next delay, with jitter, and doubles the one after.
func (b *backoff) delay() time.Duration {
	d := b.next
	d += time.Duration(rand.Int64N(int64(d)/5 + 1))
	b.next = min(b.next*2, b.max)
	return d
}

// wait sleeps for the next delay or until ctx ends (then returns its error).
func (b *backoff) wait(ctx context.Context) error {
	t := time.NewTimer(b.delay())
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

// Backoff is the kvstore's retry spacing for loops against etcd outside
// this package (writers that retry on their own schedule): the delay
// doubles from min up to max, with jitter.
type Backoff struct{ b *backoff }

// NewBackoff returns a backoff starting at min.
func NewBackoff(min, max time.Duration) *Backoff { return &Backoff{b: newBackoff(min, max)} }

// Next returns the delay before the next retry and doubles the one after.
func (b *Backoff) Next() time.Duration { return b.b.delay() }

// Reset starts over from min after a success.
func (b *Backoff) Reset() { b.b.reset() }
