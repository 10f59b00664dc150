package e2e_test

// This file's name sorts last on purpose: go test runs a package's tests
// file by file in name order, and taking the shared lab down must come
// after every other test has used it.

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tendril-net/tendril/pkg/lab"
)

// TestPrivilegedLabDown runs last (see above): it
// removes the lab and checks nothing of it is left.
func TestPrivilegedLabDown(t *testing.T) {
	e := labUp(t)
	procs, err := lab.ReadProcesses(e.st.PidDir())
	if err != nil || len(procs) == 0 {
		t.Fatalf("no recorded processes (%v)", err)
	}
	nsBefore, err := lab.ListNetns(lab.NetnsPrefix(labName))
	if err != nil || len(nsBefore) == 0 {
		t.Fatalf("no lab namespaces before down (%v)", err)
	}
	for range 2 { // idempotent
		if code, out := tendril(t, "down"); code != 0 {
			t.Fatalf("lab down: exit %d:\n%s", code, out)
		}
	}
	for _, p := range procs {
		if p.Alive() {
			t.Errorf("%s (pid %d) still running", p.Role, p.PID)
		}
	}
	if left, _ := lab.ListNetns(lab.NetnsPrefix(labName)); len(left) > 0 {
		t.Errorf("network namespaces left: %v", left)
	}
	paths := []string{lab.BPFDir(labName), lab.Dir(labName)}
	for _, n := range e.st.Nodes { // the node cgroups and their lab's directory
		paths = append(paths, n.Cgroup, filepath.Dir(n.Cgroup))
	}
	for _, path := range paths {
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind (%v)", path, err)
		}
	}
	// Nothing the lab ran may survive in any namespace: no process whose
	// command line names the lab's directory.
	entries, _ := os.ReadDir("/proc")
	for _, ent := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "cmdline"))
		if err == nil && lab.CmdlineNamesDir(cmdline, lab.Dir(labName)) {
			t.Errorf("process %s still runs: %s", ent.Name(), bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}))
		}
	}
	// No link of the lab may be left in the machine's own namespace.
	out, err := exec.Command("ip", "-o", "link", "show").CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range e.st.Nodes {
		if strings.Contains(string(out), " "+n.Name+"@") || strings.Contains(string(out), " "+n.Name+":") {
			t.Errorf("link %s in the machine's namespace:\n%s", n.Name, out)
		}
	}
	labErr = errors.New("the lab was taken down by TestPrivilegedLabDown")
}
