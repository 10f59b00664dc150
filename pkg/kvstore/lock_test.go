package kvstore

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestLockMutualExclusion: goroutines of two clients (two per client, so
// both the etcd mutex and the local path lock are exercised) increment a
// counter in etcd with a read-then-write that is only correct under the
// lock. No two are ever inside at once and no increment is lost.
func TestLockMutualExclusion(t *testing.T) {
	forEachServer(t, func(t *testing.T, srv testServer) {
		clients := []*Client{connect(t, srv.Endpoints()), connect(t, srv.Endpoints())}
		ctx := testContext(t, 120*time.Second)
		const perWorker = 8
		var inside, maxInside atomic.Int32
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for _, c := range clients {
			for range 2 {
				wg.Go(func() {
					for range perWorker {
						if err := incrementUnderLock(ctx, c, &inside, &maxInside); err != nil {
							errs <- err
							return
						}
					}
				})
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		kv, _, err := clients[0].Get(ctx, testPrefix+"counter")
		if err != nil {
			t.Fatal(err)
		}
		if want := strconv.Itoa(2 * 2 * perWorker); string(kv.Value) != want {
			t.Fatalf("counter = %s, want %s: increments were lost", kv.Value, want)
		}
		if maxInside.Load() != 1 {
			t.Fatalf("%d holders inside the critical section at once", maxInside.Load())
		}
	})
}

func incrementUnderLock(ctx context.Context, c *Client, inside, maxInside *atomic.Int32) error {
	l, err := c.Lock(ctx, "test/counter")
	if err != nil {
		return err
	}
	n := inside.Add(1)
	for {
		m := maxInside.Load()
		if n <= m || maxInside.CompareAndSwap(m, n) {
			break
		}
	}
	kv, _, err := c.Get(ctx, testPrefix+"counter")
	if err != nil {
		return err
	}
	v, _ := strconv.Atoi(string(kv.Value))
	if err := c.Update(ctx, testPrefix+"counter", []byte(strconv.Itoa(v+1)), NoLease); err != nil {
		return err
	}
	inside.Add(-1)
	return l.Unlock(ctx)
}

// TestLockWaitsForHolder: a second client cannot take a held lock; it gets
// it once the holder unlocks.
func TestLockWaitsForHolder(t *testing.T) {
	srv := newEmbeddedServer(t)
	a, b := connect(t, srv.Endpoints()), connect(t, srv.Endpoints())
	ctx := testContext(t, 60*time.Second)
	held, err := a.Lock(ctx, "test/one")
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = b.Lock(short, "test/one")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock while held = %v, want a deadline error", err)
	}
	// Another path is independent.
	other, err := b.Lock(ctx, "test/two")
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	got := make(chan error, 1)
	go func() {
		l, err := b.Lock(ctx, "test/one")
		if err == nil {
			err = l.Unlock(ctx)
		}
		got <- err
	}()
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	// Unlock twice is harmless.
	if err := held.Unlock(ctx); err != nil {
		t.Fatalf("second Unlock = %v", err)
	}
}

// TestStaleLockCollected: a lock held past the stale timeout is released
// by the collector, another client takes it, and the late Unlock says the
// lock was collected. A fresh lock is left alone.
func TestStaleLockCollected(t *testing.T) {
	srv := newEmbeddedServer(t)
	a := connect(t, srv.Endpoints(), withOption(OptLockStaleTimeout, "1h"))
	b := connect(t, srv.Endpoints())
	ctx := testContext(t, 60*time.Second)
	leaked, err := a.Lock(ctx, "test/leaked")
	if err != nil {
		t.Fatal(err)
	}
	if n := a.collectStaleLocks(ctx, time.Now()); n != 0 {
		t.Fatalf("collector released %d fresh locks", n)
	}
	// The collector's clock is an argument: two hours on, the lock is stale.
	if n := a.collectStaleLocks(ctx, time.Now().Add(2*time.Hour)); n != 1 {
		t.Fatalf("collector released %d locks, want 1", n)
	}
	l, err := b.Lock(ctx, "test/leaked")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := leaked.Unlock(ctx); !errors.Is(err, ErrLockCollected) {
		t.Fatalf("Unlock of a collected lock = %v, want ErrLockCollected", err)
	}
	// The local path lock went too: this client can lock the path again.
	again, err := a.Lock(ctx, "test/leaked")
	if err != nil {
		t.Fatal(err)
	}
	if err := again.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestLockGoesWithSession: when the holder's lease is revoked (as when it
// crashes and the lease expires), its lock is free for others.
func TestLockGoesWithSession(t *testing.T) {
	srv := newEmbeddedServer(t)
	a, b := connect(t, srv.Endpoints()), connect(t, srv.Endpoints())
	ctx := testContext(t, 60*time.Second)
	if _, err := a.Lock(ctx, "test/crash"); err != nil {
		t.Fatal(err)
	}
	lease, err := a.SessionLease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.etcd.Revoke(ctx, clientv3.LeaseID(lease)); err != nil {
		t.Fatal(err)
	}
	l, err := b.Lock(ctx, "test/crash")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
