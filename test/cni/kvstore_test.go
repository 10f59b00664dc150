package cni_test

import (
	"context"
	"log/slog"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/cilium/api/v1/models"

	"github.com/tendril-net/tendril/pkg/dbinspect"
	"github.com/tendril-net/tendril/pkg/kvstore/kvembed"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// TestPrivilegedRemoteEndpointViaKVStore: two nodes share an etcd (run in
// the test's process on a unix socket; the agent runs none itself) with
// kvstore identity allocation. A pod on A gets a cluster identity; B learns the
// pod's address with that identity in its BPF ipcache. When the pod goes,
// B forgets it.
func TestPrivilegedRemoteEndpointViaKVStore(t *testing.T) {
	testutil.Privileged(t)
	etcdDir := t.TempDir()
	socket := "unix://" + filepath.Join(etcdDir, "etcd.sock")
	srv, err := kvembed.Start(context.Background(), kvembed.Config{Dir: filepath.Join(etcdDir, "data"), ClientURL: socket, UnsafeNoFsync: true},
		slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	// Registered first, so it runs after both agents stop.
	t.Cleanup(func() { _ = srv.Stop(context.Background()) })
	a := startNode(t, "--ipv6-range", "none", "--ipv4-range", "10.77.1.0/24", "--kvstore", "etcd",
		"--kvstore-endpoints", socket, "--identity-allocation-mode", "kvstore")
	b := startNode(t, "--ipv6-range", "none", "--ipv4-range", "10.77.2.0/24", "--kvstore", "etcd",
		"--kvstore-endpoints", socket, "--identity-allocation-mode", "kvstore")
	list := a.confList("tendril-cni", "1.1.0", nil)
	pod := a.newPod("web")
	res := a.mustAdd(list, pod)
	ip := res.IPs[0].Address.IP.String()
	a.setLabels(t, "pod-name:default/web", "k8s:app=web")
	ep, err := a.agent.EndpointGet(context.Background(), "pod-name:default/web")
	if err != nil {
		t.Fatal(err)
	}
	id := ep.Status.Identity.ID
	if id < 256 {
		t.Fatalf("pod identity %d is not a cluster identity", id)
	}

	begin := time.Now()
	inB := func() bool {
		var entries []*models.IPListEntry
		if err := b.agent.Do(context.Background(), http.MethodGet, "/ip", nil, nil, nil, &entries); err != nil {
			return false
		}
		for _, e := range entries {
			if *e.Cidr == ip+"/32" && *e.Identity == id && e.Metadata.Source == "kvstore" {
				return true
			}
		}
		return false
	}
	eventually(t, "the remote endpoint in node B's ipcache", inB)
	t.Logf("remote endpoint in node B's ipcache %s after its labels were set on node A", time.Since(begin))

	// And in the pinned BPF map itself.
	cli, err := builder.Build("tendril")
	if err != nil {
		t.Fatal(err)
	}
	// (The ipcache's reconciler writes the map right after the table.)
	var out []byte
	inMap := func() bool {
		out, err = exec.Command(cli, "bpf", "ipcache", "list", "--bpf-root", b.bpfRoot).CombinedOutput()
		return err == nil && strings.Contains(string(out), ip+"/32")
	}
	if !inMap() {
		time.Sleep(time.Second)
		if !inMap() {
			t.Fatalf("node B's BPF ipcache lacks %s: %v\n%s", ip, err, out)
		}
	}
	// B's ipcache table is initialized (restored, and the kvstore's
	// initial listing in): its reconciler may prune.
	var tables []dbinspect.TableInfo
	if err := b.agent.Do(context.Background(), http.MethodGet, "/statedb/tables", nil, nil, nil, &tables); err != nil {
		t.Fatal(err)
	}
	for _, tb := range tables {
		if tb.Name == "ipcache" && !tb.Initialized {
			t.Errorf("node B's ipcache table is not initialized: waiting for %v", tb.PendingInitializers)
		}
	}
	// B sees A's identity in its identity list too (policy can select it).
	var ident models.Identity
	if err := b.agent.Do(context.Background(), http.MethodGet, "/identity/"+strconv.FormatInt(id, 10), nil, nil, nil, &ident); err != nil {
		t.Fatalf("node B does not know identity %d: %v", id, err)
	}

	if err := a.del(list, pod); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the remote endpoint gone from node B", func() bool { return !inB() })
}
