package kvstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tendril-net/tendril/pkg/testutil/tcpproxy"
)

const testPrefix = StatePrefix + "test/"

func put(t testing.TB, ctx context.Context, c *Client, key, value string) {
	t.Helper()
	if err := c.Update(ctx, key, []byte(value), NoLease); err != nil {
		t.Fatal(err)
	}
}

func del(t testing.TB, ctx context.Context, c *Client, key string) {
	t.Helper()
	if err := c.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
}

// TestListAndWatchListThenLiveEvents: the initial list (over several
// pages), the list marker, then live creates, modifies and deletes, and
// nothing from outside the prefix.
func TestListAndWatchListThenLiveEvents(t *testing.T) {
	srv := newEmbeddedServer(t)
	// Three keys a page: seven keys take three pages.
	c := connect(t, srv.Endpoints(), withOption(OptListLimit, "3"))
	ctx := testContext(t, 60*time.Second)
	var want []string
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g"} {
		put(t, ctx, c, testPrefix+k, "v-"+k)
		want = append(want, fmt.Sprintf("create %s%s=v-%s", testPrefix, k, k))
	}
	// Sharing the prefix's string start without being under it.
	put(t, ctx, c, StatePrefix+"test-other/a", "x")
	put(t, ctx, c, StatePrefix+"other/a", "x")

	watchCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := c.ListAndWatch(watchCtx, testPrefix)
	expectEvents(t, ctx, events, append(want, "list-done")...)

	put(t, ctx, c, testPrefix+"h", "v-h")
	put(t, ctx, c, testPrefix+"a", "v-a2")
	del(t, ctx, c, testPrefix+"b")
	put(t, ctx, c, StatePrefix+"other/a", "y")
	del(t, ctx, c, StatePrefix+"other/a")
	if err := c.Update(ctx, testPrefix+"leased", []byte("l"), SessionLease); err != nil {
		t.Fatal(err)
	}
	put(t, ctx, c, testPrefix+"sentinel", "end")
	got := expectEvents(t, ctx, events,
		"create "+testPrefix+"h=v-h",
		"modify "+testPrefix+"a=v-a2",
		"delete "+testPrefix+"b",
		"create "+testPrefix+"leased=l",
		// The sentinel comes next: no stray event came in between.
		"create "+testPrefix+"sentinel=end",
	)
	lease, err := c.SessionLease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got[3].Lease != lease || got[0].Lease != 0 {
		t.Fatalf("event leases = %d and %d, want %d and 0", got[3].Lease, got[0].Lease, lease)
	}
	for i := 1; i < len(got); i++ {
		if got[i].Revision <= got[i-1].Revision {
			t.Fatalf("revisions not increasing: %d then %d", got[i-1].Revision, got[i].Revision)
		}
	}

	cancel()
	expectClosed(t, ctx, events)
}

// TestListAndWatchRelistAfterCompaction cuts one client off etcd while
// another changes the prefix and compacts the history the first one would
// resume from. On reconnect its watch fails with ErrCompacted, and the
// re-list delivers exactly the difference: the modified and new keys, and
// deletes for the keys that vanished meanwhile. A key created and deleted
// during the cut was never seen, so it produces nothing.
func TestListAndWatchRelistAfterCompaction(t *testing.T) {
	srv := newEmbeddedServer(t)
	proxy := tcpproxy.Start(t, srv.Endpoints()[0])
	watcher := connect(t, []string{proxy.URL()}, withLeaseTTL(5*time.Minute))
	writer := connect(t, srv.Endpoints())
	ctx := testContext(t, 90*time.Second)

	for i := 1; i <= 5; i++ {
		put(t, ctx, writer, fmt.Sprintf("%sk%d", testPrefix, i), "v1")
	}
	events := watcher.ListAndWatch(ctx, testPrefix)
	expectEvents(t, ctx, events,
		"create "+testPrefix+"k1=v1", "create "+testPrefix+"k2=v1", "create "+testPrefix+"k3=v1",
		"create "+testPrefix+"k4=v1", "create "+testPrefix+"k5=v1", "list-done")

	proxy.Pause()
	del(t, ctx, writer, testPrefix+"k1")
	del(t, ctx, writer, testPrefix+"k2")
	put(t, ctx, writer, testPrefix+"k3", "v2")
	put(t, ctx, writer, testPrefix+"k6", "v1")
	put(t, ctx, writer, testPrefix+"k7", "v1")
	del(t, ctx, writer, testPrefix+"k7")
	resp, err := writer.etcd.Get(ctx, "any")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := writer.etcd.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	proxy.Resume()

	// A resumed watch would replay in revision order (delete k1 first,
	// then k7's create and delete); the re-list sends list order: changed
	// keys, then the deletes.
	expectEvents(t, ctx, events,
		"modify "+testPrefix+"k3=v2",
		"create "+testPrefix+"k6=v1",
		"delete "+testPrefix+"k1",
		"delete "+testPrefix+"k2",
	)
	// And the watch is live again.
	put(t, ctx, writer, testPrefix+"k8", "v1")
	del(t, ctx, writer, testPrefix+"k4")
	expectEvents(t, ctx, events, "create "+testPrefix+"k8=v1", "delete "+testPrefix+"k4")
}

// TestListAndWatchEmptyPrefix: an empty prefix still sends the marker,
// and the channel closes when the context ends.
func TestListAndWatchEmptyPrefix(t *testing.T) {
	srv := newEmbeddedServer(t)
	c := connect(t, srv.Endpoints())
	ctx := testContext(t, 30*time.Second)
	watchCtx, cancel := context.WithCancel(ctx)
	events := c.ListAndWatch(watchCtx, testPrefix)
	expectEvents(t, ctx, events, "list-done")
	cancel()
	expectClosed(t, ctx, events)
}

// TestEtcdRestartResumesWatch restarts etcd (the embedded one on the same
// directory and address; the binary after SIGKILL) under a running
// ListAndWatch: the client reports the outage, reconnects, and every
// change, before and after the restart, arrives once and in order.
func TestEtcdRestartResumesWatch(t *testing.T) {
	forEachServer(t, func(t *testing.T, srv testServer) {
		c := connect(t, srv.Endpoints())
		ctx := testContext(t, 120*time.Second)
		put(t, ctx, c, testPrefix+"k1", "v1")
		put(t, ctx, c, testPrefix+"k2", "v1")
		events := c.ListAndWatch(ctx, testPrefix)
		expectEvents(t, ctx, events, "create "+testPrefix+"k1=v1", "create "+testPrefix+"k2=v1", "list-done")
		leaseBefore, err := c.SessionLease(ctx)
		if err != nil {
			t.Fatal(err)
		}

		// Written just before the outage: delivered before or after it,
		// but delivered.
		put(t, ctx, c, testPrefix+"before", "v1")
		srv.Stop(t)
		waitFor(t, ctx, "status disconnected", func() bool { return c.Status().State == StateDisconnected })
		srv.Start(t)
		waitFor(t, ctx, "status connected", func() bool { return c.Status().State == StateConnected })

		put(t, ctx, c, testPrefix+"after", "v1")
		put(t, ctx, c, testPrefix+"k1", "v2")
		del(t, ctx, c, testPrefix+"k2")
		put(t, ctx, c, testPrefix+"sentinel", "end")
		expectEvents(t, ctx, events,
			"create "+testPrefix+"before=v1",
			"create "+testPrefix+"after=v1",
			"modify "+testPrefix+"k1=v2",
			"delete "+testPrefix+"k2",
			"create "+testPrefix+"sentinel=end",
		)
		// etcd keeps leases across restarts: the session survived.
		leaseAfter, err := c.SessionLease(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if leaseAfter != leaseBefore {
			t.Logf("session lease changed across the restart: %x -> %x", leaseBefore, leaseAfter)
		}
	})
}
