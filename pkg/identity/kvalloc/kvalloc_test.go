package kvalloc

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/kvstore"
	"github.com/tendril-net/tendril/pkg/kvstore/kvembed"
)

var (
	server   *kvembed.Server
	startErr error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kvalloc-")
	if err != nil {
		startErr = err
	} else {
		server, startErr = kvembed.Start(context.Background(), kvembed.Config{Dir: dir, UnsafeNoFsync: true}, quiet())
	}
	code := m.Run()
	if server != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		_ = server.Stop(ctx)
		cancel()
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func connect(t *testing.T) *kvstore.Client {
	t.Helper()
	if startErr != nil {
		t.Fatalf("embedded etcd: %v", startErr)
	}
	cfg := kvstore.DefaultConfig()
	cfg.Endpoints = server.Endpoints()
	cfg.ConnectTimeout = 20 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := kvstore.Connect(ctx, cfg, quiet())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Close(ctx)
	})
	return c
}

func startAllocator(t *testing.T, node string) (*Allocator, *kvstore.Client) {
	t.Helper()
	c := connect(t)
	a := New(c, node, quiet())
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go a.Run(ctx)
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	if err := a.WaitSynced(wctx); err != nil {
		t.Fatal(err)
	}
	return a, c
}

func TestTwoNodesAllocateConcurrently(t *testing.T) {
	a1, _ := startAllocator(t, "node1")
	a2, _ := startAllocator(t, "node2")
	const sets = 30
	var got [2][sets]identity.NumericIdentity
	var wg sync.WaitGroup
	errs := make(chan error, 2*sets)
	for n, a := range []*Allocator{a1, a2} {
		for i := 0; i < sets; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				id, _, err := a.Allocate([]string{"k8s:app=race" + strconv.Itoa(i)})
				if err != nil {
					errs <- err
					return
				}
				got[n][i] = id.ID
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i := 0; i < sets; i++ {
		if got[0][i] != got[1][i] {
			t.Fatalf("label set %d: node1 %d, node2 %d", i, got[0][i], got[1][i])
		}
	}
	// No master key was left behind by a lost race: exactly one per set.
	c := connect(t)
	kvs, _, err := c.GetPrefix(context.Background(), IDPrefix)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, kv := range kvs {
		if strings.HasPrefix(string(kv.Value), "k8s:app=race") {
			n++
		}
	}
	if n != sets {
		t.Fatalf("%d master keys for %d label sets", n, sets)
	}
	// Each node holds one reference key per set.
	vals, _, err := c.GetPrefix(context.Background(), ValuePrefix)
	if err != nil {
		t.Fatal(err)
	}
	per := map[string]int{}
	for _, kv := range vals {
		per[kv.Key[strings.LastIndex(kv.Key, "/")+1:]]++
	}
	if per["node1"] < sets || per["node2"] < sets {
		t.Fatalf("references per node: %v", per)
	}
}

func TestThousandDistinctLabelSets(t *testing.T) {
	a, _ := startAllocator(t, "bulk")
	seen := map[identity.NumericIdentity]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, 1000)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < 1000; i += 8 {
				id, _, err := a.Allocate([]string{"k8s:app=bulk" + strconv.Itoa(i), "k8s:io.kubernetes.pod.namespace=bulk"})
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				if prev, dup := seen[id.ID]; dup {
					errs <- fmt.Errorf("identity %d given to sets %d and %d", id.ID, prev, i)
				}
				seen[id.ID] = i
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(seen) != 1000 {
		t.Fatalf("%d distinct identities for 1,000 label sets", len(seen))
	}
}

// TestLeaseExpiryReleasesReferences: a node dies (its session lease is
// revoked, as its expiry would); its references vanish, the other node's
// stay, and the other node's view of the identity is unaffected.
func TestLeaseExpiryReleasesReferences(t *testing.T) {
	dead, deadClient := startAllocator(t, "dying")
	alive, _ := startAllocator(t, "alive")
	labels := []string{"k8s:app=lease"}
	id1, _, err := dead.Allocate(labels)
	if err != nil {
		t.Fatal(err)
	}
	id2, _, err := alive.Allocate(labels)
	if err != nil || id2.ID != id1.ID {
		t.Fatalf("alive got %v %v, want %d", id2, err, id1.ID)
	}
	c := connect(t)
	refs := func() string {
		kvs, _, err := c.GetPrefix(context.Background(), ValuePrefix+hashOf(identity.LabelsKey(labels))+"/")
		if err != nil {
			t.Fatal(err)
		}
		var nodes []string
		for _, kv := range kvs {
			nodes = append(nodes, kv.Key[strings.LastIndex(kv.Key, "/")+1:])
		}
		return fmt.Sprint(nodes)
	}
	if got := refs(); got != "[alive dying]" {
		t.Fatalf("references %s", got)
	}
	lease, err := deadClient.SessionLease(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	raw, err := clientv3.New(clientv3.Config{Endpoints: server.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := raw.Revoke(context.Background(), clientv3.LeaseID(lease)); err != nil {
		t.Fatal(err)
	}
	if got := refs(); got != "[alive]" {
		t.Fatalf("after the lease went: references %s", got)
	}
	if _, ok := alive.Lookup(id1.ID); !ok {
		t.Fatal("the surviving node lost the identity")
	}
}

// TestMalformedValueSkipped: a master key whose value or name does not
// parse is skipped; the watch goes on and later identities arrive.
func TestMalformedValueSkipped(t *testing.T) {
	c := connect(t)
	ctx := context.Background()
	// The package's tests share one etcd and allocate at random in the
	// cluster range: an earlier test's identity 4000 or 4001, listed by
	// the allocator below before the keys are overwritten, would keep its
	// good value (a malformed update is skipped, not a delete).
	for _, id := range []string{"12", "4000", "4001"} {
		if err := c.Delete(ctx, IDPrefix+id); err != nil {
			t.Fatal(err)
		}
	}
	a, _ := startAllocator(t, "watcher")
	for _, kv := range [][2]string{{IDPrefix + "not-a-number", "k8s:app=x"}, {IDPrefix + "12", "k8s:app=reserved-range"}, {IDPrefix + "4000", ""}} {
		if err := c.Update(ctx, kv[0], []byte(kv[1]), kvstore.NoLease); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Update(ctx, IDPrefix+"4001", []byte("k8s:app=fine"), kvstore.NoLease); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if l, ok := a.Lookup(4001); ok && l.Labels[0] == "k8s:app=fine" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the watch stopped at the malformed keys")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, bad := range []identity.NumericIdentity{12, 4000} {
		if _, ok := a.Lookup(bad); ok {
			t.Errorf("malformed identity %d accepted", bad)
		}
	}
}

func BenchmarkAllocate(b *testing.B) {
	if startErr != nil {
		b.Fatal(startErr)
	}
	cfg := kvstore.DefaultConfig()
	cfg.Endpoints = server.Endpoints()
	c, err := kvstore.Connect(context.Background(), cfg, quiet())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close(context.Background())
	a := New(c, "bench", quiet())
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, _, err := a.Allocate([]string{"k8s:app=bench" + strconv.Itoa(i), "k8s:run=" + strconv.FormatInt(time.Now().UnixNano(), 10)}); err != nil {
			b.Fatal(err)
		}
	}
}

// TestSeparatorInLabelNeverReachesTheKVStore: a label holding ';' is
// refused before its master key is written; before, node1 allocated the
// one label "k8s:app=a;k8s:role=admin" and node2 read the key back as the
// two labels app=a and role=admin, a set a role=admin policy selects.
func TestSeparatorInLabelNeverReachesTheKVStore(t *testing.T) {
	a1, c := startAllocator(t, "node1")
	bad := []string{"k8s:app=smuggle;k8s:role=admin"}
	if id, _, err := a1.Allocate(bad); err == nil {
		t.Errorf("Allocate(%q) = identity %d, want an error", bad, id.ID)
	}
	kvs, _, err := c.GetPrefix(context.Background(), IDPrefix)
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range kvs {
		if strings.Contains(string(kv.Value), "smuggle") {
			t.Errorf("master key %s = %q written", kv.Key, kv.Value)
		}
	}
}
