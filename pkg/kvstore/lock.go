package kvstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"
)

// ErrLockCollected is returned by Unlock when the lock was held past the
// stale-lock timeout and the collector released it: the critical section
// may not have been exclusive to its end.
var ErrLockCollected = errors.New("lock held past the stale-lock timeout and released by the collector")

// Lock is a distributed lock held by this client. Locks are for short
// critical sections (an identity allocation): one held past the stale-lock
// timeout (option etcd.lockStaleTimeout) is released by the collector, so
// that a leaked lock cannot block every other node for good.
type Lock struct {
	c        *Client
	path     string
	mutex    *concurrency.Mutex
	acquired time.Time
	release  func() // frees the local path lock

	mu        sync.Mutex
	done      bool // unlocked or collected
	collected bool
}

// Lock takes the lock named path, waiting until it is free or ctx ends.
// Mutual exclusion holds between clients (an etcd mutex under
// LockPrefix+path+"/", bound to the session, so a crashed holder's lock
// goes with its lease) and between goroutines of this client (etcd's mutex
// lets one session take a lock it already holds, so a local lock per path
// comes first).
func (c *Client) Lock(ctx context.Context, path string) (*Lock, error) {
	release, err := c.locks.lockLocal(ctx, path)
	if err != nil {
		return nil, fmt.Errorf("kvstore lock %q: %w", path, err)
	}
	s, err := c.sessions.wait(ctx)
	if err != nil {
		release()
		return nil, fmt.Errorf("kvstore lock %q: %w", path, err)
	}
	m := concurrency.NewMutex(s, LockPrefix+path+"/")
	if err := m.Lock(ctx); err != nil {
		release()
		return nil, fmt.Errorf("kvstore lock %q: %w", path, err)
	}
	l := &Lock{c: c, path: path, mutex: m, acquired: time.Now(), release: release}
	c.locks.add(l)
	return l, nil
}

// Path is the lock's name.
func (l *Lock) Path() string { return l.path }

// Key is the etcd key that holds the lock.
func (l *Lock) Key() string { return l.mutex.Key() }

// Unlock releases the lock. When deleting the etcd key fails the lock stays
// held (Unlock may be retried; the collector releases it in the end).
func (l *Lock) Unlock(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done {
		if l.collected {
			return fmt.Errorf("kvstore unlock %q: %w", l.path, ErrLockCollected)
		}
		return nil
	}
	if err := l.mutex.Unlock(ctx); err != nil {
		return fmt.Errorf("kvstore unlock %q: %w", l.path, err)
	}
	l.finishLocked(false)
	return nil
}

func (l *Lock) finishLocked(collected bool) {
	l.done, l.collected = true, collected
	l.c.locks.remove(l)
	l.release()
}

// collect force-releases a stale lock; false if it was released meanwhile
// or its key could not be deleted (the next round retries).
func (l *Lock) collect(ctx context.Context) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done {
		return false
	}
	if err := l.mutex.Unlock(ctx); err != nil {
		l.c.log.Warn("Cannot release stale kvstore lock; retrying later", "path", l.path, "error", err)
		return false
	}
	l.finishLocked(true)
	return true
}

// lockRegistry holds this client's local path locks and its held locks.
type lockRegistry struct {
	mu    sync.Mutex
	paths map[string]*pathLock
	held  map[*Lock]struct{}
}

// pathLock is a context-aware mutex for one path: holding it is having
// put the one token in sem.
type pathLock struct {
	sem   chan struct{}
	users int // holders and waiters, so the entry can be dropped at 0
}

func newLockRegistry() *lockRegistry {
	return &lockRegistry{paths: map[string]*pathLock{}, held: map[*Lock]struct{}{}}
}

func (r *lockRegistry) lockLocal(ctx context.Context, path string) (func(), error) {
	r.mu.Lock()
	pl := r.paths[path]
	if pl == nil {
		pl = &pathLock{sem: make(chan struct{}, 1)}
		r.paths[path] = pl
	}
	pl.users++
	r.mu.Unlock()
	done := func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if pl.users--; pl.users == 0 {
			delete(r.paths, path)
		}
	}
	select {
	case pl.sem <- struct{}{}:
		var once sync.Once
		return func() {
			once.Do(func() {
				<-pl.sem
				done()
			})
		}, nil
	case <-ctx.Done():
		done()
		return nil, ctx.Err()
	}
}

func (r *lockRegistry) add(l *Lock) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.held[l] = struct{}{}
}

func (r *lockRegistry) remove(l *Lock) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.held, l)
}

// stale returns the locks acquired before cutoff.
func (r *lockRegistry) stale(cutoff time.Time) []*Lock {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*Lock
	for l := range r.held {
		if l.acquired.Before(cutoff) {
			out = append(out, l)
		}
	}
	return out
}

// collectStaleLocks releases the locks held longer than the stale-lock
// timeout as of now, and returns how many it released.
func (c *Client) collectStaleLocks(ctx context.Context, now time.Time) int {
	n := 0
	for _, l := range c.locks.stale(now.Add(-c.opts.lockStaleTimeout)) {
		opCtx, cancel := context.WithTimeout(ctx, probeTimeout)
		if l.collect(opCtx) {
			n++
			c.log.Warn("Released a kvstore lock held past the stale-lock timeout", "path", l.path,
				"held", now.Sub(l.acquired).Round(time.Millisecond), "timeout", c.opts.lockStaleTimeout)
		}
		cancel()
	}
	return n
}

func (c *Client) lockCollectorLoop(ctx context.Context) {
	t := time.NewTicker(max(c.opts.lockStaleTimeout/4, time.Second))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			c.collectStaleLocks(ctx, now)
		}
	}
}
