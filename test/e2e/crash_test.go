package e2e_test

import (
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/tendril-net/tendril/pkg/lab"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// TestPrivilegedLabRecoversFromKill9: a second lab is brought up, every
// one of its processes is killed with SIGKILL (as a crash of the machine's
// session would), and `lab up` on the same name cleans the leftovers and
// comes up again with Ready pods; `lab down` then leaves nothing.
func TestPrivilegedLabRecoversFromKill9(t *testing.T) {
	testutil.Privileged(t)
	testutil.Require(t, labErr == nil, "no binaries for the lab")
	const name = "tdrcrash"
	binDir := filepath.Dir(tendrilBin)
	up := func() string {
		t.Helper()
		out, err := exec.Command(tendrilBin, "lab", "--name", name, "up", "--nodes", "2", "--pods-per-node", "1", "--bin-dir", binDir).CombinedOutput()
		if err != nil {
			t.Fatalf("lab up: %v\n%s", err, out)
		}
		return string(out)
	}
	t.Cleanup(func() { _ = exec.Command(tendrilBin, "lab", "--name", name, "down").Run() })
	up()
	st, err := lab.LoadState(name)
	if err != nil {
		t.Fatal(err)
	}
	procs, err := lab.ReadProcesses(st.PidDir())
	if err != nil || len(procs) < 5 {
		t.Fatalf("lab processes %v (%v)", procs, err)
	}
	for _, p := range procs {
		_ = syscall.Kill(p.PID, syscall.SIGKILL)
	}
	out := up()
	if !strings.Contains(out, "pods: 2 running") && !strings.Contains(out, "2 running") {
		t.Fatalf("second lab up did not bring the pods back:\n%s", out)
	}
	if out, err := exec.Command(tendrilBin, "lab", "--name", name, "down").CombinedOutput(); err != nil {
		t.Fatalf("lab down: %v\n%s", err, out)
	}
	left, err := lab.ListLabNetns(name)
	if err != nil || len(left) != 0 {
		t.Fatalf("namespaces left after down: %v (%v)", left, err)
	}
}
