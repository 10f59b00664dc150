package cni_test

import (
	"encoding/json"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// TestPrivilegedStateDBInspectionAndIPCachePrune runs the CLI against a
// live node: `tendril statedb list` shows the ipcache table initialized
// with nothing pending, `tendril statedb dump ipcache` shows a pod's
// prefix with its claim and status Done (as rows and as statedb's JSON),
// `tendril status` counts the table's unrealized objects. Then, with the
// agent down, a stale entry is put in the pinned BPF ipcache: the
// restarted agent's reconciler prunes it once the agent has restored,
// and keeps the pod's entry.
func TestPrivilegedStateDBInspectionAndIPCachePrune(t *testing.T) {
	testutil.Privileged(t)
	args := []string{"--ipv6-range", "none", "--ipv4-range", "10.232.0.0/24"}
	n := startNode(t, args...)
	list := n.confList("tendril-cni", "1.1.0", nil)
	res := n.mustAdd(list, n.newPod("inspect"))
	podIP := res.IPs[0].Address.IP.String() + "/32"

	cli, err := builder.Build("tendril")
	if err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(cli, append([]string{"-H", "unix://" + n.socket}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("tendril %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	ipcacheRow := func() []string {
		for _, line := range strings.Split(run("statedb", "list"), "\n") {
			if f := strings.Fields(line); len(f) > 0 && f[0] == "ipcache" {
				return f
			}
		}
		return nil
	}
	// TABLE OBJECTS REVISION INITIALIZED PENDING FAILING
	eventually(t, "the ipcache table initialized with nothing pending", func() bool {
		f := ipcacheRow()
		return len(f) == 6 && f[3] == "yes" && f[4] == "0" && f[5] == "0" && f[1] != "0"
	})

	t.Logf("tendril statedb list:\n%s", run("statedb", "list"))
	dump := run("statedb", "dump", "ipcache")
	t.Logf("tendril statedb dump ipcache:\n%s", dump)
	var podLine string
	for _, line := range strings.Split(dump, "\n") {
		if strings.HasPrefix(line, podIP+" ") {
			podLine = line
		}
	}
	for _, want := range []string{"local", "endpoint/", "Done"} {
		if !strings.Contains(podLine, want) {
			t.Errorf("the pod's row lacks %q: %q\n%s", want, podLine, dump)
		}
	}
	if !strings.HasPrefix(dump, "PREFIX") || !strings.Contains(dump, "0.0.0.0/0") {
		t.Errorf("dump lacks its header or the world prefix:\n%s", dump)
	}

	var objs []struct {
		Prefix   string
		Resolved struct{ Source, Owner string }
		Status   struct{ Kind string }
	}
	if err := json.Unmarshal([]byte(run("-o", "json", "statedb", "dump", "ipcache")), &objs); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, o := range objs {
		if o.Prefix == podIP {
			found = true
			if o.Resolved.Source != "local" || !strings.HasPrefix(o.Resolved.Owner, "endpoint/") || o.Status.Kind != "Done" {
				t.Errorf("the pod's object in the JSON dump: %+v", o)
			}
		}
	}
	if !found {
		t.Errorf("the pod's prefix %s is not in the JSON dump", podIP)
	}
	if st := run("status"); !strings.Contains(st, "0 pending, 0 failing") {
		t.Errorf("status lacks the ipcache table's realization:\n%s", st)
	}

	// A leftover of a previous run in the pinned map goes once the
	// restarted agent has restored.
	n.killAgent(t)
	stale := netip.MustParsePrefix("10.232.9.9/32")
	pinned, err := maps.OpenPinned(n.bpfRoot, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := pinned.IPCacheMap().Upsert(stale, maps.IPCacheEntry{Identity: 4242}); err != nil {
		pinned.Close()
		t.Fatal(err)
	}
	pinned.Close()
	n.runAgent(t, args...)
	lookup := func(p netip.Prefix) bool {
		m, err := maps.OpenPinned(n.bpfRoot, true)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		_, ok, err := m.IPCacheMap().Lookup(p)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	eventually(t, "the stale ipcache entry pruned after the restart", func() bool { return !lookup(stale) })
	if !lookup(netip.MustParsePrefix(podIP)) {
		t.Errorf("the pod's entry %s is gone from the BPF ipcache after the restart", podIP)
	}
}
