package kvstore

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

const storePrefix = StatePrefix + "nodes/v1/"

func joinStore(t testing.TB, c *Client, onEvent func(Event)) *SharedStore {
	t.Helper()
	s, err := JoinSharedStore(c, SharedStoreConfig{Prefix: storePrefix, OnEvent: onEvent}, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

func storeView(s *SharedStore) string {
	m := s.List()
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, k+"="+string(m[k]))
	}
	return strings.Join(parts, ",")
}

// TestSharedStore: two clients each keep a key in one store and see each
// other's; updates and deletes propagate; a local key someone else deletes
// comes back; Close removes the client's keys.
func TestSharedStore(t *testing.T) {
	srv := newEmbeddedServer(t)
	ca, cb := connect(t, srv.Endpoints()), connect(t, srv.Endpoints())
	ctx := testContext(t, 60*time.Second)
	a, b := joinStore(t, ca, nil), joinStore(t, cb, nil)
	for _, s := range []*SharedStore{a, b} {
		select {
		case <-s.Synced():
		case <-ctx.Done():
			t.Fatal("store never synced")
		}
	}
	if err := a.UpsertLocal(ctx, "node-a", []byte("10.0.0.1")); err != nil {
		t.Fatal(err)
	}
	if err := b.UpsertLocal(ctx, "node-b", []byte("10.0.0.2")); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*SharedStore{a, b} {
		waitFor(t, ctx, "both nodes in both stores", func() bool { return storeView(s) == "node-a=10.0.0.1,node-b=10.0.0.2" })
	}
	if v, ok := b.Get("node-a"); !ok || string(v) != "10.0.0.1" {
		t.Fatalf("b.Get(node-a) = %q, %v", v, ok)
	}
	if got := a.LocalKeys(); !slices.Equal(got, []string{"node-a"}) {
		t.Fatalf("a.LocalKeys() = %q", got)
	}

	if err := a.UpsertLocal(ctx, "node-a", []byte("10.0.0.9")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "b sees a's update", func() bool { return storeView(b) == "node-a=10.0.0.9,node-b=10.0.0.2" })

	// Someone deletes a's key behind its back: a writes it again.
	if err := cb.Delete(ctx, storePrefix+"node-a"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "a's key written again", func() bool {
		kv, found, err := cb.Get(ctx, storePrefix+"node-a")
		return err == nil && found && string(kv.Value) == "10.0.0.9"
	})

	if err := b.DeleteLocal(ctx, "node-b"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "a sees b's delete", func() bool { return storeView(a) == "node-a=10.0.0.9" })

	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "b sees a's keys go with Close", func() bool { return storeView(b) == "" })
	if err := a.UpsertLocal(ctx, "node-a", nil); err == nil {
		t.Fatal("UpsertLocal after Close succeeded")
	}
}

// TestSessionRenewalRewritesSharedStoreKeys revokes a client's session
// lease from outside (what happens when etcd expires it during a long
// partition): the keys bound to it vanish, the client opens a new session,
// and its shared store writes its keys again, bound to the new lease.
func TestSessionRenewalRewritesSharedStoreKeys(t *testing.T) {
	srv := newEmbeddedServer(t)
	owner := connect(t, srv.Endpoints())
	observer := connect(t, srv.Endpoints())
	ctx := testContext(t, 60*time.Second)

	store := joinStore(t, owner, nil)
	if err := store.UpsertLocal(ctx, "node-a", []byte("10.0.0.1")); err != nil {
		t.Fatal(err)
	}
	if err := store.UpsertLocal(ctx, "node-a-health", []byte("10.0.0.2")); err != nil {
		t.Fatal(err)
	}
	events := observer.ListAndWatch(ctx, storePrefix)
	got := expectEvents(t, ctx, events,
		"create "+storePrefix+"node-a=10.0.0.1", "create "+storePrefix+"node-a-health=10.0.0.2", "list-done")
	oldLease := got[0].Lease
	if oldLease == 0 {
		t.Fatal("store key not bound to the session lease")
	}
	renewals, stop := owner.SessionRenewals()
	defer stop()

	if _, err := observer.etcd.Revoke(ctx, clientv3.LeaseID(oldLease)); err != nil {
		t.Fatal(err)
	}
	expectEvents(t, ctx, events, "delete "+storePrefix+"node-a", "delete "+storePrefix+"node-a-health")
	select {
	case <-renewals:
	case <-ctx.Done():
		t.Fatal("no session renewal after the lease was revoked")
	}
	// The two keys are written again in either order (the first write
	// may be the one that finds the lease gone).
	back := expectEventSet(t, ctx, events,
		"create "+storePrefix+"node-a=10.0.0.1", "create "+storePrefix+"node-a-health=10.0.0.2")
	newLease, err := owner.SessionLease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if newLease == oldLease || back[0].Lease != newLease || back[1].Lease != newLease {
		t.Fatalf("keys rewritten with leases %x, %x; old session %x, new %x", back[0].Lease, back[1].Lease, oldLease, newLease)
	}
}

// TestSharedStorePeriodicSync: a local key overwritten by someone else
// (no delete, so nothing triggers an immediate rewrite) is repaired by the
// periodic sync.
func TestSharedStorePeriodicSync(t *testing.T) {
	srv := newEmbeddedServer(t)
	owner, other := connect(t, srv.Endpoints()), connect(t, srv.Endpoints())
	ctx := testContext(t, 60*time.Second)
	s, err := JoinSharedStore(owner, SharedStoreConfig{Prefix: storePrefix, SyncInterval: 100 * time.Millisecond}, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	if err := s.UpsertLocal(ctx, "node-a", []byte("mine")); err != nil {
		t.Fatal(err)
	}
	if err := other.Update(ctx, storePrefix+"node-a", []byte("theirs"), NoLease); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the periodic sync to restore the key", func() bool {
		kv, found, err := other.Get(ctx, storePrefix+"node-a")
		return err == nil && found && string(kv.Value) == "mine" && kv.Lease != 0
	})
}

// TestListAndWatchStopsWithClient: closing the client ends its streams.
func TestListAndWatchStopsWithClient(t *testing.T) {
	srv := newEmbeddedServer(t)
	c := connect(t, srv.Endpoints())
	ctx := testContext(t, 30*time.Second)
	events := c.ListAndWatch(ctx, testPrefix)
	expectEvents(t, ctx, events, "list-done")
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	expectClosed(t, ctx, events)
	if err := c.Close(ctx); err != nil {
		t.Fatalf("second Close = %v", err)
	}
}

func TestJoinSharedStoreRejectsBadPrefix(t *testing.T) {
	for _, prefix := range []string{"", "tendril/state/nodes"} {
		if _, err := JoinSharedStore(nil, SharedStoreConfig{Prefix: prefix}, testLog(t)); err == nil {
			t.Errorf("prefix %q accepted", prefix)
		}
	}
}
