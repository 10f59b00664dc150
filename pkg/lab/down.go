package lab

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	dpwg "github.com/tendril-net/tendril/pkg/datapath/wireguard"
	"github.com/tendril-net/tendril/pkg/namedns"
)

// Down removes everything the named lab made, whether it came up fully,
// half, or crashed: the recorded processes, every process left inside the
// lab's network namespaces (agents, pod workloads), the namespaces (their
// links go with them), the nodes' cgroups, the pinned BPF objects and the
// lab's directory. It
// is idempotent; out gets one line per kind of thing removed.
func Down(name string, out io.Writer) error {
	if err := ValidateName(name); err != nil {
		return err
	}
	var errs []error
	dir := Dir(name)
	procs, err := ReadProcesses((&State{Dir: dir}).PidDir())
	if err != nil {
		errs = append(errs, err)
	}
	var live []Process
	for _, p := range procs {
		if p.Alive() {
			live = append(live, p)
		}
	}
	// Kubelets first would be kinder, but nothing of the lab needs to shut
	// down cleanly: the whole state goes.
	if left := killAndWait(live, 10*time.Second); len(left) > 0 {
		errs = append(errs, fmt.Errorf("processes still alive after SIGKILL: %v", left))
	}
	if len(live) > 0 {
		fmt.Fprintf(out, "  stopped %d processes\n", len(live))
	}

	names, err := ListLabNetns(name)
	if err != nil {
		errs = append(errs, err)
	}
	inside := processesInNetns(names)
	var stray []Process
	for _, ps := range inside {
		stray = append(stray, ps...)
	}
	if left := killAndWait(stray, 10*time.Second); len(left) > 0 {
		errs = append(errs, fmt.Errorf("processes in the lab's namespaces still alive after SIGKILL: %v", left))
	}
	if len(stray) > 0 {
		fmt.Fprintf(out, "  stopped %d processes inside the lab's network namespaces\n", len(stray))
	}
	if n, err := downRealNodes(name); err != nil {
		errs = append(errs, err)
	} else if n > 0 {
		fmt.Fprintf(out, "  removed %d real nodes' containers, mount namespaces and kubelet cgroups\n", n)
	}
	for _, n := range names {
		if err := DeleteNetns(n); err != nil {
			errs = append(errs, err)
		}
	}
	if len(names) > 0 {
		fmt.Fprintf(out, "  removed %d network namespaces\n", len(names))
	}
	if n, err := deleteHealthNetns(dir); err != nil {
		errs = append(errs, err)
	} else if n > 0 {
		fmt.Fprintf(out, "  removed %d health endpoint namespaces\n", n)
	}

	// After the processes: a cgroup with members cannot be removed. What
	// is still inside (a probe, a lab exec command) is the lab's too.
	if mount, err := Cgroup2Mount(); err == nil {
		n, err := removeLabCgroups(mount, name)
		if err != nil {
			errs = append(errs, err)
		}
		if n > 0 {
			fmt.Fprintf(out, "  removed %d node cgroups under %s\n", n, LabCgroupDir(mount, name))
		}
	}

	if _, err := os.Stat(BPFDir(name)); err == nil {
		if err := os.RemoveAll(BPFDir(name)); err != nil {
			errs = append(errs, fmt.Errorf("remove pinned BPF objects: %w", err))
		} else {
			fmt.Fprintf(out, "  removed pinned BPF objects under %s\n", BPFDir(name))
		}
	}
	// The userspace WireGuard devices' control sockets and saved
	// configurations (their processes, inside the nodes' namespaces, were
	// killed above and could not remove them; a configuration holds a
	// private key).
	if st, err := LoadState(name); err == nil && st.Encryption == "wireguard" {
		for i := range st.Nodes {
			dev := WireGuardDevice(name, i)
			_ = os.Remove(filepath.Join(dpwg.StateDir, dev+".sock"))
			_ = os.Remove(dpwg.StatePath(dev))
		}
	}
	// The parent directories go when no other lab uses them.
	_ = os.Remove(BPFRoot)
	if _, err := os.Stat(dir); err == nil {
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", dir, err))
		} else {
			fmt.Fprintf(out, "  removed %s\n", dir)
		}
	}
	_ = os.Remove(RunRoot)
	return errors.Join(errs...)
}

// deleteHealthNetns removes the health endpoints' namespaces the lab's
// agents made (pkg/agent/nodehealth: named after the node and its state
// directory, outside the lab's prefix since the agent does not know its
// lab). Their veths went with the nodes' namespaces.
func deleteHealthNetns(dir string) (int, error) {
	nodes, err := os.ReadDir(filepath.Join(dir, "nodes"))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("list the lab's nodes: %w", err)
	}
	n := 0
	var errs []error
	for _, node := range nodes {
		// nodehealth.HealthNetnsPrefix; the state directory as up.go gives it.
		name := namedns.AgentScoped("tendril-health-", node.Name(), filepath.Join(dir, "nodes", node.Name(), "state"))
		if _, err := os.Stat(namedns.Path(name)); err != nil {
			continue
		}
		if err := DeleteNetns(name); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}
