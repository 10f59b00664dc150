package ipcache

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
)

// MaxBatch is the most claims the queue makes in one write transaction:
// enough that 100,000 one-claim events cost about what batched writers
// pay, few enough that the table is never locked for long.
const MaxBatch = 1000

// linger is how long the queue's job waits for more claims before a
// write when the previous write was moments ago (a burst: a listing, a
// node's pods coming up): on 2 cores the job would otherwise take the
// few claims queued since its last write and pay one transaction each.
// The first claim after a quiet spell is written at once.
const linger = time.Millisecond

// queuedOp is one queued claim, its withdrawal, or a function to run once
// every claim queued before it is in the table.
type queuedOp struct {
	prefix netip.Prefix
	entry  Entry // an Upsert's claim
	del    bool
	src    Source // a Delete's
	owner  Owner
	then   func()
}

// queue holds the claims of event-driven sources (other nodes' endpoints
// from TendrilEndpoints and the kvstore) until the queue's job writes
// them, as many per transaction as have piled up: a source that sends one
// address per event then costs what a batched writer costs, and its
// callback never waits for the table.
type queue struct {
	log *slog.Logger

	mu     sync.Mutex
	ops    []queuedOp
	queued uint64 // ops queued so far
	done   uint64 // ops applied so far
	// progress is closed (and replaced) whenever done advances.
	progress chan struct{}
	kick     chan struct{}
}

func newQueue(log *slog.Logger) *queue {
	return &queue{log: log, progress: make(chan struct{}), kick: make(chan struct{}, 1)}
}

func (q *queue) push(op queuedOp) {
	q.mu.Lock()
	q.ops = append(q.ops, op)
	q.queued++
	q.mu.Unlock()
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

// UpsertQueued is Upsert without waiting: the claim is made by the
// queue's job together with the other claims queued by then, in order.
// An invalid claim is refused here, so that it never fails a batch.
func (c *IPCache) UpsertQueued(prefix netip.Prefix, e Entry) error {
	if e.Owner == "" {
		return fmt.Errorf("ipcache %s: claim in source %s without an owner", prefix, e.Source)
	}
	c.queue.push(queuedOp{prefix: prefix, entry: e})
	return nil
}

// DeleteQueued is Delete without waiting, ordered with the queued claims.
func (c *IPCache) DeleteQueued(prefix netip.Prefix, src Source, owner Owner) {
	c.queue.push(queuedOp{prefix: prefix, del: true, src: src, owner: owner})
}

// AfterQueued runs fn (on the queue's job) once every claim queued before
// it is in the table: a source marks its initial listing in with it.
func (c *IPCache) AfterQueued(fn func()) {
	c.queue.push(queuedOp{then: fn})
}

// waitQueued waits until every op queued before the call is applied.
func (q *queue) waitQueued(ctx context.Context) error {
	q.mu.Lock()
	target := q.queued
	q.mu.Unlock()
	for {
		q.mu.Lock()
		done, progress := q.done, q.progress
		q.mu.Unlock()
		if done >= target {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("ipcache: queued claims not yet written (%d of %d): %w", done, target, ctx.Err())
		case <-progress:
		}
	}
}

// run is the queue's job: it writes what is queued, MaxBatch claims per
// transaction, until ctx ends.
func (c *IPCache) runQueue(ctx context.Context, _ cell.Health) error {
	q := c.queue
	var lastWrite time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-q.kick:
		}
		if time.Since(lastWrite) < linger {
			q.mu.Lock()
			short := len(q.ops) < MaxBatch
			q.mu.Unlock()
			if short {
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(linger):
				}
			}
		}
		for {
			// Take the whole queue: the writers append to a fresh slice
			// meanwhile (draining the head of a shared one would make
			// every append past its capacity copy what is left).
			q.mu.Lock()
			ops := q.ops
			q.ops = nil
			q.mu.Unlock()
			if len(ops) == 0 {
				break
			}
			for len(ops) > 0 {
				n := min(len(ops), MaxBatch)
				c.applyBatch(ops[:n])
				ops = ops[n:]
				lastWrite = time.Now()
				q.mu.Lock()
				q.done += uint64(n)
				close(q.progress)
				q.progress = make(chan struct{})
				q.mu.Unlock()
			}
		}
	}
}

// applyBatch makes the batch's claims, one transaction up to each
// function to run after them; a claim the table refuses is logged and
// skipped, never failing the others.
func (c *IPCache) applyBatch(batch []queuedOp) {
	for len(batch) > 0 {
		var thens []func()
		_ = c.Write(func(w *Writer) error {
			for len(batch) > 0 {
				op := batch[0]
				batch = batch[1:]
				if op.then != nil {
					thens = append(thens, op.then)
					return nil
				}
				var err error
				if op.del {
					err = w.Delete(op.prefix, op.src, op.owner)
				} else {
					err = w.Upsert(op.prefix, op.entry)
				}
				if err != nil {
					c.log.Warn("ipcache: queued claim refused", "prefix", op.prefix, "error", err)
				}
			}
			return nil
		})
		for _, fn := range thens {
			fn()
		}
	}
}
