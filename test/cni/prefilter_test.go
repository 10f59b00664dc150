package cni_test

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/tendril-net/tendril/pkg/testutil"
)

// TestPrivilegedPrefilterAcrossAgentRestart: a real agent in a node
// namespace with --enable-xdp-prefilter on a device of its own; the stock
// cilium-dbg adds CIDRs (prefilter update) and lists them; the XDP program
// stays on the device while the agent is killed, and the restarted agent
// lists the same CIDRs at the same revision (saved before the update was
// answered), then deletes one (prefilter delete at that revision).
func TestPrivilegedPrefilterAcrossAgentRestart(t *testing.T) {
	testutil.Privileged(t)
	out, err := exec.Command("../../hack/cilium-dbg.sh").Output()
	testutil.Require(t, err == nil, "stock cilium-dbg not built")
	dbgBin := strings.TrimSpace(string(out))
	n := newNode(t)
	if out, err := inNetns(n.netns, "ip", "link", "add", "tdrpf0", "type", "veth", "peer", "name", "tdrpf1"); err != nil {
		t.Fatalf("veth: %v: %s", err, out)
	}
	for _, dev := range []string{"tdrpf0", "tdrpf1"} {
		if out, err := inNetns(n.netns, "ip", "link", "set", dev, "up"); err != nil {
			t.Fatalf("%s up: %v: %s", dev, err, out)
		}
	}
	args := []string{"--enable-xdp-prefilter", "--devices", "tdrpf0", "--enable-health-checking=false"}
	n.start(t, args...)
	dbg := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(dbgBin, append([]string{"-H", "unix://" + n.socket}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("cilium-dbg %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	xdpOn := func() bool {
		out, err := inNetns(n.netns, "ip", "-d", "link", "show", "tdrpf0")
		return err == nil && strings.Contains(string(out), "xdp")
	}

	dbg("prefilter", "update", "--cidr", "198.51.100.0/24", "--cidr", "2001:db8:bad::/48")
	list := dbg("prefilter", "list")
	if !strings.Contains(list, "Revision: 2") || !strings.Contains(list, "198.51.100.0/24") || !strings.Contains(list, "2001:db8:bad::/48") {
		t.Fatalf("prefilter list:\n%s", list)
	}
	if !xdpOn() {
		t.Fatal("no XDP program on tdrpf0")
	}

	_ = n.cmd.Process.Kill()
	deadline := time.Now().Add(30 * time.Second)
	for n.cmd.ProcessState == nil && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if !xdpOn() {
		t.Fatal("the XDP program left tdrpf0 with the agent")
	}
	n.runAgent(t, args...)
	list = dbg("prefilter", "list")
	if !strings.Contains(list, "Revision: 2") || !strings.Contains(list, "198.51.100.0/24") || !strings.Contains(list, "2001:db8:bad::/48") {
		t.Fatalf("prefilter list after the restart:\n%s", list)
	}
	dbg("prefilter", "delete", "--revision", "2", "--cidr", "198.51.100.0/24")
	list = dbg("prefilter", "list")
	if !strings.Contains(list, "Revision: 3") || strings.Contains(list, "198.51.100.0/24") {
		t.Fatalf("prefilter list after delete:\n%s", list)
	}
	out, err = exec.Command(dbgBin, "-H", "unix://"+n.socket, "status").CombinedOutput()
	t.Logf("cilium-dbg status (exit %v):\n%s", err, out)
}
