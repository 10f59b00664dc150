package identitygc

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/identity/kvalloc"
	"github.com/tendril-net/tendril/pkg/kvstore"
	"github.com/tendril-net/tendril/pkg/operator/kvstoreclient"
	"github.com/tendril-net/tendril/pkg/operator/operatortest"
	"github.com/tendril-net/tendril/pkg/testutil/etcdproc"
	"github.com/tendril-net/tendril/pkg/testutil/tcpproxy"
)

// leaseOutage is a real etcd process, an agent ("node-a") that reaches it
// through a proxy a test can cut (a partition of that agent alone) with a
// two-second session lease, another agent ("node-b") and the operator's
// GC connected directly.
type leaseOutage struct {
	proxy  *tcpproxy.Proxy
	gcKV   *kvstore.Client
	a, b   *kvalloc.Allocator
	gc     *Collector
	now    time.Time
	clockM sync.Mutex
}

func newLeaseOutage(t *testing.T) *leaseOutage {
	t.Helper()
	etcd := etcdproc.Start(t)
	o := &leaseOutage{proxy: tcpproxy.Start(t, etcd.Endpoints()[0]), now: time.Now()}
	connect := func(endpoint string, ttl time.Duration) *kvstore.Client {
		cfg := kvstore.DefaultConfig()
		cfg.Endpoints = []string{endpoint}
		cfg.ConnectTimeout = 30 * time.Second
		if ttl > 0 {
			cfg.LeaseTTL = ttl
		}
		kv, err := kvstore.Connect(context.Background(), cfg, operatortest.Quiet())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = kv.Close(ctx)
		})
		return kv
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	start := func(kv *kvstore.Client, node string) *kvalloc.Allocator {
		a := kvalloc.New(kv, node, operatortest.Quiet())
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.Run(ctx)
		}()
		// Cleanups run last-first: cancel, then wait for Run.
		t.Cleanup(wg.Wait)
		t.Cleanup(cancel)
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		defer wcancel()
		if err := a.WaitSynced(wctx); err != nil {
			t.Fatal(err)
		}
		return a
	}
	o.a = start(connect(o.proxy.URL(), 2*time.Second), "node-a")
	o.b = start(connect(etcd.Endpoints()[0], 0), "node-b")
	o.gcKV = connect(etcd.Endpoints()[0], 0)
	o.gc = New(testConfig("kvstore", time.Minute), operatortest.Quiet(), nil, nil, kvstoreclient.ForClient(o.gcKV))
	o.gc.SetClock(func() time.Time {
		o.clockM.Lock()
		defer o.clockM.Unlock()
		return o.now
	})
	return o
}

func (o *leaseOutage) advance(d time.Duration) {
	o.clockM.Lock()
	o.now = o.now.Add(d)
	o.clockM.Unlock()
}

func (o *leaseOutage) get(t *testing.T, key string) (string, bool) {
	t.Helper()
	kv, found, err := o.gcKV.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return string(kv.Value), found
}

// partitionUntilCollected cuts node-a off for longer than its lease TTL
// (its reference expires with the lease) and runs the GC past its grace
// period meanwhile: the identity node-a still uses is collected.
func (o *leaseOutage) partitionUntilCollected(t *testing.T, id identity.NumericIdentity, labels []string) {
	t.Helper()
	vk := kvalloc.ValuePrefix + kvalloc.LabelsHash(identity.LabelsKey(labels)) + "/node-a"
	if _, found := o.get(t, vk); !found {
		t.Fatal("node-a's reference is missing before the outage")
	}
	o.proxy.Pause()
	operatortest.WaitFor(t, "node-a's reference to expire with its lease", time.Minute, func() bool {
		_, found := o.get(t, vk)
		return !found
	})
	if r, err := o.gc.Pass(context.Background()); err != nil || r.Marked == 0 {
		t.Fatalf("first GC pass: %s %v", r, err)
	}
	o.advance(2 * time.Minute)
	if r, err := o.gc.Pass(context.Background()); err != nil || r.Deleted == 0 {
		t.Fatalf("GC pass after the grace period: %s %v", r, err)
	}
	if _, found := o.get(t, kvalloc.IDPrefix+strconv.Itoa(int(id))); found {
		t.Fatal("the GC left the unreferenced identity")
	}
}

// TestKVStoreInUseIdentitySurvivesLeaseExpiry: node-a uses an identity;
// etcd is out of its reach for longer than its lease TTL, so its reference
// expires and the operator's GC collects the identity. When node-a is back
// (a new session), the identity is there again with the same number and
// labels and node-a's reference, the GC keeps it from then on, and no
// other label set can take the number.
func TestKVStoreInUseIdentitySurvivesLeaseExpiry(t *testing.T) {
	o := newLeaseOutage(t)
	labels := []string{"k8s:app=survivor", "k8s:io.kubernetes.pod.namespace=lease"}
	key := identity.LabelsKey(labels)
	ident, _, err := o.a.Allocate(labels)
	if err != nil {
		t.Fatal(err)
	}
	master := kvalloc.IDPrefix + strconv.Itoa(int(ident.ID))
	vk := kvalloc.ValuePrefix + kvalloc.LabelsHash(key) + "/node-a"
	o.partitionUntilCollected(t, ident.ID, labels)

	o.proxy.Resume()
	// The restore writes the master key, the reference, then the index
	// key, in that order: wait for all three.
	index := kvalloc.LabelsPrefix + kvalloc.LabelsHash(key)
	want := strconv.Itoa(int(ident.ID))
	operatortest.WaitFor(t, "node-a to restore the identity, its reference and its index key", time.Minute, func() bool {
		m, mFound := o.get(t, master)
		v, vFound := o.get(t, vk)
		_, xFound := o.get(t, index)
		return mFound && m == key && vFound && v == want && xFound
	})
	if x, _ := o.get(t, index); x != want {
		t.Fatalf("index key %q, want %s", x, want)
	}
	// In use again: the GC unmarks it and keeps it past any grace.
	for range 2 {
		o.advance(time.Hour)
		if r, err := o.gc.Pass(context.Background()); err != nil || r.Deleted != 0 {
			t.Fatalf("GC pass after the outage: %s %v", r, err)
		}
	}
	if m, found := o.get(t, master); !found || m != key {
		t.Fatalf("identity %d after the GC: %q (found %v)", ident.ID, m, found)
	}
	// The number is not free: another label set cannot create it, and
	// another node allocating node-a's labels gets the same number.
	if ok, err := o.gcKV.CreateOnly(context.Background(), master, []byte("k8s:app=intruder"), kvstore.NoLease); err != nil || ok {
		t.Fatalf("another label set took identity %d: ok=%v err=%v", ident.ID, ok, err)
	}
	got, _, err := o.b.Allocate(labels)
	if err != nil || got.ID != ident.ID {
		t.Fatalf("node-b got %v %v for node-a's labels, want %d", got, err, ident.ID)
	}
	if l, ok := o.b.Lookup(ident.ID); !ok || identity.LabelsKey(l.Labels) != key {
		t.Fatalf("node-b knows %d as %v (known %v)", ident.ID, l.Labels, ok)
	}
}

// TestKVStoreReusedNumberIsRevoked: as above, but while node-a is cut off
// another label set takes the collected number (node-b allocates it). When
// node-a is back it must not claim the number for its labels (every other
// node maps it to the other labels): it revokes its references, its users
// are told to allocate again, and they get a number of their own; node-b's
// identity is untouched.
func TestKVStoreReusedNumberIsRevoked(t *testing.T) {
	o := newLeaseOutage(t)
	labels := []string{"k8s:app=evicted", "k8s:io.kubernetes.pod.namespace=lease"}
	key := identity.LabelsKey(labels)
	ident, _, err := o.a.Allocate(labels)
	if err != nil {
		t.Fatal(err)
	}
	revoked := make(chan identity.NumericIdentity, 4)
	o.a.SubscribeRevoked(func(id identity.NumericIdentity, l []string) {
		if identity.LabelsKey(l) == key {
			revoked <- id
		}
	})
	o.partitionUntilCollected(t, ident.ID, labels)

	// Another label set gets the number: node-b creates it as its
	// allocator does (master key, then index) and references it.
	other := []string{"k8s:app=newcomer", "k8s:io.kubernetes.pod.namespace=lease"}
	otherKey := identity.LabelsKey(other)
	master := kvalloc.IDPrefix + strconv.Itoa(int(ident.ID))
	ctx := context.Background()
	if ok, err := o.gcKV.CreateOnly(ctx, master, []byte(otherKey), kvstore.NoLease); err != nil || !ok {
		t.Fatalf("create %s: %v %v", master, ok, err)
	}
	if ok, err := o.gcKV.CreateOnly(ctx, kvalloc.LabelsPrefix+kvalloc.LabelsHash(otherKey), []byte(strconv.Itoa(int(ident.ID))), kvstore.NoLease); err != nil || !ok {
		t.Fatalf("create index: %v %v", ok, err)
	}
	if got, _, err := o.b.Allocate(other); err != nil || got.ID != ident.ID {
		t.Fatalf("node-b got %v %v, want %d", got, err, ident.ID)
	}

	o.proxy.Resume()
	select {
	case id := <-revoked:
		if id != ident.ID {
			t.Fatalf("revoked %d, want %d", id, ident.ID)
		}
	case <-time.After(time.Minute):
		t.Fatalf("node-a kept identity %d for %v after it went to %v", ident.ID, labels, other)
	}
	if _, held := o.a.BoundLabels(ident.ID); held {
		t.Fatal("node-a still holds the number for its old labels")
	}
	// Its users allocate again: a new number for the same labels.
	again, _, err := o.a.Allocate(labels)
	if err != nil {
		t.Fatal(err)
	}
	if again.ID == ident.ID {
		t.Fatalf("node-a's labels got number %d again, which now means %v", again.ID, other)
	}
	if m, _ := o.get(t, kvalloc.IDPrefix+strconv.Itoa(int(again.ID))); m != key {
		t.Fatalf("new identity %d's master key is %q", again.ID, m)
	}
	if v, _ := o.get(t, kvalloc.ValuePrefix+kvalloc.LabelsHash(key)+"/node-a"); v != strconv.Itoa(int(again.ID)) {
		t.Fatalf("node-a's reference names %q, want %d", v, again.ID)
	}
	// node-b's identity is as node-b made it.
	if m, _ := o.get(t, master); m != otherKey {
		t.Fatalf("identity %d is %q, want %q", ident.ID, m, otherKey)
	}
	if v, found := o.get(t, kvalloc.ValuePrefix+kvalloc.LabelsHash(otherKey)+"/node-b"); !found || v != strconv.Itoa(int(ident.ID)) {
		t.Fatalf("node-b's reference %q (found %v)", v, found)
	}
}
