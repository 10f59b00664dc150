package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/cilium/api/v1/models"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/agent/agentidentity"
	"github.com/tendril-net/tendril/pkg/agent/agentkv"
	"github.com/tendril-net/tendril/pkg/dbinspect"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/identity/kvalloc"
	"github.com/tendril-net/tendril/pkg/kvstore"
	"github.com/tendril-net/tendril/pkg/kvstore/kvembed"
	"github.com/tendril-net/tendril/pkg/testutil/etcdproc"
)

// TestKVStoreIdentities runs the agent against an etcd on a unix socket
// (in the test's process) with kvstore identity allocation: an identity
// another node writes into etcd shows in the agent's /v1/identity, and
// status reports the kvstore.
func TestKVStoreIdentities(t *testing.T) {
	dir := t.TempDir()
	socket := "unix://" + filepath.Join(dir, "etcd.sock")
	srv, err := kvembed.Start(context.Background(), kvembed.Config{Dir: filepath.Join(dir, "etcd"), ClientURL: socket, UnsafeNoFsync: true}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	// Registered first, so it runs after the agent's stop.
	t.Cleanup(func() { _ = srv.Stop(context.Background()) })
	_, c := startAgent(t, map[string]string{"kvstore": agentkv.ModeEtcd, "kvstore-endpoints": socket,
		"identity-allocation-mode": agentidentity.AllocationKVStore})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	kcfg := kvstore.DefaultConfig()
	kcfg.Endpoints = srv.Endpoints()
	kc, err := kvstore.Connect(ctx, kcfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close(ctx)
	if err := kc.Update(ctx, kvalloc.IDPrefix+"5000", []byte("k8s:app=from-another-node"), kvstore.NoLease); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var id models.Identity
		err := c.Do(ctx, http.MethodGet, "/identity/5000", nil, nil, nil, &id)
		if err == nil && len(id.Labels) == 1 && id.Labels[0] == "k8s:app=from-another-node" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("identity 5000 not visible: %+v %v", id, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The API read it from the identities table, which `tendril statedb
	// dump identities` shows: the learned identity, with no reference here.
	var rows dbinspect.Rows
	if err := c.Do(ctx, http.MethodGet, "/statedb/rows/identities", nil, nil, nil, &rows); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(rows.Rows, func(r []string) bool { return fmt.Sprint(r) == "[5000 k8s:app=from-another-node 0]" }) {
		t.Fatalf("identities table rows %v lack identity 5000", rows.Rows)
	}
	var st ext.StatusResponse
	if err := c.Do(ctx, http.MethodGet, "/healthz", nil, nil, nil, &st); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range st.Tendril.Sections {
		if s.Title == "KVStore" && strings.HasPrefix(s.Lines[0].Value, "connected") {
			found = true
		}
	}
	if !found {
		t.Fatalf("status has no connected KVStore section: %+v", st.Tendril.Sections)
	}
}

// TestUnreachableKVStoreFailsStartClearly: the agent retries for the
// connect timeout, then stops with an error naming the kvstore.
func TestUnreachableKVStoreFailsStartClearly(t *testing.T) {
	flags := testFlags(t.TempDir(), map[string]string{
		"bpf-root": "/sys/fs/bpf/tendril-test-unused",
		"kvstore":  agentkv.ModeEtcd, "kvstore-endpoints": "http://127.0.0.1:1", "kvstore-connect-timeout": "2s",
		"identity-allocation-mode": agentidentity.AllocationKVStore,
	})
	a, err := newTestAgent(Deps{Log: testLogger(t)}, flags)
	if err != nil {
		t.Fatal(err)
	}
	err = a.Start(context.Background())
	if err == nil {
		_ = a.Stop(context.Background())
		t.Fatal("agent started without its kvstore")
	}
	if !strings.Contains(err.Error(), "kvstore") || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Fatalf("error %q does not name the kvstore", err)
	}
}

func TestKVStoreConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flags map[string]string
		want  string
	}{
		{"kvstore allocation without kvstore", map[string]string{"identity-allocation-mode": agentidentity.AllocationKVStore}, "needs --kvstore"},
		{"etcd without endpoints", map[string]string{"kvstore": agentkv.ModeEtcd}, "kvstore-endpoints"},
		{"unknown kvstore", map[string]string{"kvstore": "consul"}, "must be empty or etcd"},
		{"embedded etcd", map[string]string{"kvstore": agentkv.ModeEmbedded}, "no longer runs an etcd server"},
		{"unknown allocation mode", map[string]string{"identity-allocation-mode": "random"}, "must be crd, kvstore or local"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := newTestAgent(Deps{}, testFlags(t.TempDir(), tc.flags))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// fixedIdentity stands in for the datapath's identity allocation (the
// datapath is off in these tests): every endpoint gets id.
type fixedIdentity uint32

func (f fixedIdentity) Regenerate(_ context.Context, ep *endpoint.Endpoint) error {
	ep.Identity = uint32(f)
	return nil
}

func (fixedIdentity) Remove(context.Context, *endpoint.Endpoint) error { return nil }

// publishedAddresses reads the ipcache keys in etcd as ip → endpoint name.
func publishedAddresses(ctx context.Context, c *kvstore.Client) (map[string]string, error) {
	kvs, _, err := c.GetPrefix(ctx, agentkv.IPPrefix)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, kv := range kvs {
		var e agentkv.IPEntry
		if err := json.Unmarshal(kv.Value, &e); err != nil {
			return nil, fmt.Errorf("key %s: %w", kv.Key, err)
		}
		out[strings.TrimPrefix(kv.Key, agentkv.IPPrefix)] = e.Name
	}
	return out, nil
}

// TestKVStoreAddressPublishingDoesNotWaitForEtcd runs the agent against
// the real etcd binary and stops etcd. Endpoints created the way CNI ADD
// creates them (and one deleted) complete while etcd is down, leaving
// their keys pending, instead of waiting for etcd; the publisher's writes
// fail and are retried, and once etcd is back the keys are in it with no
// further event, and the deleted endpoint's key is gone.
func TestKVStoreAddressPublishingDoesNotWaitForEtcd(t *testing.T) {
	etcd := etcdproc.Start(t)
	a, c := startAgent(t, map[string]string{"kvstore": agentkv.ModeEtcd, "kvstore-endpoints": strings.Join(etcd.Endpoints(), ","),
		"ipv4-range": "10.79.0.0/28", "ipv6-range": "none"})
	// A failure while etcd is down must not leave the agent's stop (which
	// deletes its keys, with no deadline in tests) waiting for it.
	t.Cleanup(func() {
		if !etcd.Running() {
			etcd.Start(t)
		}
	})
	a.endpoints.AddRegenerateHook(fixedIdentity(4321))
	create := func(name, ip string) (*endpoint.Endpoint, error) {
		return a.endpoints.CreateEndpoint(context.Background(), &endpoint.Endpoint{ContainerID: "c-" + name, IfName: "eth0",
			PodNamespace: "ns", PodName: name, IPv4: netip.MustParseAddr(ip)})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// With etcd up, an endpoint's address is published.
	first, err := create("first", "10.79.0.5")
	if err != nil {
		t.Fatal(err)
	}
	kc, err := kvstore.Connect(ctx, testKVConfig(etcd.Endpoints()), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	waitPublished(t, ctx, kc, "map[10.79.0.5:first]")
	_ = kc.Close(ctx)

	// etcd goes away. CNI ADDs (and a DEL) finish while it is down: etcd's
	// client waits for a connection, so a call that wrote to etcd would
	// block until the publisher's write timeout, or forever; the old
	// synchronous publisher took 10 s per address.
	etcd.Stop(t)
	done := make(chan error, 1)
	go func() {
		if _, err := create("second", "10.79.0.6"); err != nil {
			done <- err
			return
		}
		if _, err := create("third", "10.79.0.7"); err != nil {
			done <- err
			return
		}
		done <- a.endpoints.Manager().Delete(context.Background(), first.ID)
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("creating endpoints waits for the stopped etcd")
	}
	// They returned without their keys written: all three changes wait
	// for etcd, which is still down.
	st := a.kvstore.Publisher().Status()
	if etcd.Running() || st.Keys != 2 || st.Pending != 3 {
		t.Fatalf("after the creates: etcd running %v, publisher %+v; want 2 addresses with 3 writes pending", etcd.Running(), st)
	}
	var hz ext.StatusResponse
	if err := c.Do(ctx, http.MethodGet, "/healthz", nil, nil, nil, &hz); err != nil {
		t.Fatal(err)
	}
	if line := statusLine(hz, "KVStore", "Endpoint addresses"); !strings.HasPrefix(line, "2 addresses, 3 writes pending") {
		t.Fatalf("status line during the outage %q, want 2 addresses and 3 writes pending", line)
	}

	// The outage outlasts a write attempt: the publisher is retrying when
	// etcd comes back.
	for a.kvstore.Publisher().Status().LastError == nil {
		select {
		case <-ctx.Done():
			t.Fatal("no write failed while etcd was down")
		case <-time.After(50 * time.Millisecond):
		}
	}

	// etcd comes back: the keys follow, by the publisher's retries alone.
	etcd.Start(t)
	kc, err = kvstore.Connect(ctx, testKVConfig(etcd.Endpoints()), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close(ctx)
	waitPublished(t, ctx, kc, "map[10.79.0.6:second 10.79.0.7:third]")

	// Nothing is left pending; the status keeps the outage's error.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := c.Do(ctx, http.MethodGet, "/healthz", nil, nil, nil, &hz); err != nil {
			t.Fatal(err)
		}
		line := statusLine(hz, "KVStore", "Endpoint addresses")
		if strings.HasPrefix(line, "2 addresses, 0 writes pending; last error") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status line %q, want 2 addresses, none pending, and the outage's error", line)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestKVStoreAddressesRepublishedAfterLeaseLoss: when the session lease
// the keys are bound to is revoked (as when it expires during a long
// outage), the keys are written again under the new session.
func TestKVStoreAddressesRepublishedAfterLeaseLoss(t *testing.T) {
	etcd := etcdproc.Start(t)
	a, _ := startAgent(t, map[string]string{"kvstore": agentkv.ModeEtcd, "kvstore-endpoints": strings.Join(etcd.Endpoints(), ","),
		"ipv4-range": "10.79.0.0/28", "ipv6-range": "none"})
	a.endpoints.AddRegenerateHook(fixedIdentity(4321))
	if _, err := a.endpoints.CreateEndpoint(context.Background(), &endpoint.Endpoint{ContainerID: "c-one", IfName: "eth0",
		PodNamespace: "ns", PodName: "one", IPv4: netip.MustParseAddr("10.79.0.9")}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	raw, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	var lease clientv3.LeaseID
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := raw.Get(ctx, agentkv.IPPrefix+"10.79.0.9")
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 1 {
			lease = clientv3.LeaseID(resp.Kvs[0].Lease)
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the address was never published")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := raw.Revoke(ctx, lease); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(time.Minute)
	for {
		resp, err := raw.Get(ctx, agentkv.IPPrefix+"10.79.0.9")
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 1 && clientv3.LeaseID(resp.Kvs[0].Lease) != lease && resp.Kvs[0].Lease != 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the key was not written again under a new lease: %v", resp.Kvs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func testKVConfig(endpoints []string) kvstore.Config {
	cfg := kvstore.DefaultConfig()
	cfg.Endpoints = endpoints
	cfg.ConnectTimeout = 30 * time.Second
	return cfg
}

// waitPublished polls etcd until the published addresses are want (the
// deadline only ends a wait for what never happens).
func waitPublished(t *testing.T, ctx context.Context, kc *kvstore.Client, want string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		got, err := publishedAddresses(ctx, kc)
		if err == nil && fmt.Sprint(got) == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("published addresses %v (error %v), want %s", got, err, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// statusLine is the value of one line of one section of the status.
func statusLine(st ext.StatusResponse, section, key string) string {
	for _, s := range st.Tendril.Sections {
		if s.Title != section {
			continue
		}
		for _, l := range s.Lines {
			if l.Key == key {
				return l.Value
			}
		}
	}
	return ""
}

// TestKVStoreStaleAddressesPruned: keys of this node left in etcd by an
// earlier run (its lease still alive after a kill -9, here a key with no
// lease) whose endpoints are gone are deleted once the agent has restored
// its endpoints and listed the kvstore; another node's key stays, and the
// current endpoint's key is published.
func TestKVStoreStaleAddressesPruned(t *testing.T) {
	etcd := etcdproc.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kc, err := kvstore.Connect(ctx, testKVConfig(etcd.Endpoints()), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close(ctx)
	for _, e := range []agentkv.IPEntry{{IP: "10.79.0.12", Identity: 4321, Node: "node-a", Namespace: "ns", Name: "stale"},
		{IP: "10.79.0.13", Identity: 4321, Node: "node-b", Namespace: "ns", Name: "elsewhere"}} {
		v, _ := json.Marshal(e)
		if err := kc.Update(ctx, agentkv.IPPrefix+e.IP, v, kvstore.NoLease); err != nil {
			t.Fatal(err)
		}
	}
	a, c := startAgent(t, map[string]string{"kvstore": agentkv.ModeEtcd, "kvstore-endpoints": strings.Join(etcd.Endpoints(), ","),
		"ipv4-range": "10.79.0.0/28", "ipv6-range": "none"})
	a.endpoints.AddRegenerateHook(fixedIdentity(4321))
	if _, err := a.endpoints.CreateEndpoint(ctx, &endpoint.Endpoint{ContainerID: "c-live", IfName: "eth0",
		PodNamespace: "ns", PodName: "live", IPv4: netip.MustParseAddr("10.79.0.5")}); err != nil {
		t.Fatal(err)
	}
	waitPublished(t, ctx, kc, "map[10.79.0.13:elsewhere 10.79.0.5:live]")

	// `tendril statedb`: the table is initialized (so it pruned) and
	// shows the live key, written.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var tables []dbinspect.TableInfo
		if err := c.Do(ctx, http.MethodGet, "/statedb/tables", nil, nil, nil, &tables); err != nil {
			t.Fatal(err)
		}
		var rows dbinspect.Rows
		if err := c.Do(ctx, http.MethodGet, "/statedb/rows/kvstore-addresses", nil, nil, nil, &rows); err != nil {
			t.Fatal(err)
		}
		initialized := slices.ContainsFunc(tables, func(ti dbinspect.TableInfo) bool {
			return ti.Name == "kvstore-addresses" && ti.Initialized && ti.Reconciled && ti.Pending == 0
		})
		live := len(rows.Rows) == 1 && rows.Rows[0][0] == "10.79.0.5" && strings.HasPrefix(rows.Rows[0][2], "Done")
		if initialized && live {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("kvstore-addresses: tables %+v, rows %v", tables, rows.Rows)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
