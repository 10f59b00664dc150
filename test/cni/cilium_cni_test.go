package cni_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/tendril-net/tendril/pkg/testutil"
)

// ciliumCNI returns the stock cilium-cni (v1.18.8), building it into the
// cache outside the repository on first use (several minutes, once).
func ciliumCNI(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("TENDRIL_CILIUM_CNI"); p != "" {
		return p
	}
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "build-cilium-cni.sh")
	out, err := exec.Command(script).Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		testutil.Require(t, false, "building cilium-cni failed: "+err.Error()+": "+stderr)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}

// TestPrivilegedStockCiliumCNI shows the agent's API compatibility: the
// unmodified cilium-cni plugin, pointed at the Tendril agent's socket,
// completes ADD, CHECK and DEL, and its pods reach each other.
func TestPrivilegedStockCiliumCNI(t *testing.T) {
	testutil.Privileged(t)
	bin := ciliumCNI(t)
	n := startNode(t)
	if err := os.Symlink(bin, filepath.Join(n.binDir, "cilium-cni")); err != nil {
		t.Fatal(err)
	}
	list := n.confList("cilium-cni", "1.0.0", map[string]any{"log-file": filepath.Join(n.dir, "cilium-cni.log")})
	t.Cleanup(func() {
		if t.Failed() {
			if b, err := os.ReadFile(filepath.Join(n.dir, "cilium-cni.log")); err == nil {
				t.Logf("cilium-cni log:\n%s", b)
			}
		}
	})

	a, b := n.newPod("stock-a"), n.newPod("stock-b")
	resA, resB := n.mustAdd(list, a), n.mustAdd(list, b)
	t.Logf("ADD stock-a: %s; stock-b: %s", resA, resB)
	if len(resA.IPs) == 0 || len(resB.IPs) == 0 {
		t.Fatalf("results without addresses: %v / %v", resA, resB)
	}
	if len(n.endpoints()) < 2 {
		t.Errorf("agent has %d endpoints after two ADDs", len(n.endpoints()))
	}
	// Every family the agent handed out must carry traffic.
	for _, ip := range resB.IPs {
		if err := ping(a, ip.Address.IP.String()); err != nil {
			t.Error(err)
		}
	}
	for _, ip := range resA.IPs {
		if err := ping(b, ip.Address.IP.String()); err != nil {
			t.Error(err)
		}
	}
	for _, p := range []*pod{a, b} {
		if err := n.check(list, p); err != nil {
			t.Errorf("CHECK %s: %v", p.name, err)
		}
	}
	for _, p := range []*pod{a, b} {
		if err := n.del(list, p); err != nil {
			t.Errorf("DEL %s: %v", p.name, err)
		}
	}
	if err := n.del(list, a); err != nil {
		t.Errorf("second DEL: %v", err)
	}
	// cilium-cni leaves the veth to go with the pod's netns; the agent
	// must have dropped the endpoints and released their addresses.
	for _, ep := range n.endpoints() {
		if ids := ep.Status.ExternalIdentifiers; ids != nil && ids.ContainerID != "" {
			t.Errorf("endpoint %d (container %s) left after DEL", ep.ID, ids.ContainerID)
		}
	}
	if al := n.podAllocations(); len(al) != 0 {
		t.Errorf("allocations left after DEL: %v", al)
	}
}
