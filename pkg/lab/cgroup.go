package lab

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Per-node cgroups: the lab's nodes share one machine, hence one cgroup
// tree, but each node's agent attaches socket load-balancing to "its"
// cgroup v2 (--cgroup-root), and only that node's pod workloads (and the
// lab commands run on their behalf) may live there: one node's socket
// hooks must never translate another node's connections, and nothing of
// the lab is ever attached at the machine's root cgroup.

// CgroupSubdir is the directory under the cgroup2 mount that holds every
// lab's node cgroups, one subdirectory per lab.
const CgroupSubdir = "tendril-lab"

// Cgroup2Mount finds where cgroup v2 is mounted, from /proc/mounts.
func Cgroup2Mount() (string, error) {
	f, err := os.Open("/proc/mounts")
	if err != nil {
		return "", fmt.Errorf("find the cgroup2 mount: %w", err)
	}
	defer f.Close()
	return parseCgroup2Mount(f)
}

// parseCgroup2Mount returns the first cgroup2 mount point of a mounts
// table (/proc/mounts format).
func parseCgroup2Mount(r io.Reader) (string, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 3 && fields[2] == "cgroup2" {
			// /proc/mounts escapes spaces and the like as octal.
			return unescapeMountField(fields[1]), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("read /proc/mounts: %w", err)
	}
	return "", errors.New("no cgroup2 file system is mounted (the lab needs cgroup v2 for per-node socket load-balancing)")
}

func unescapeMountField(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// LabCgroupDir is the cgroup directory of the named lab under mount.
func LabCgroupDir(mount, name string) string {
	return filepath.Join(mount, CgroupSubdir, name)
}

// NodeCgroupDir is a node's cgroup: <mount>/tendril-lab/<lab>/<node>.
func NodeCgroupDir(mount, name, node string) string {
	return filepath.Join(LabCgroupDir(mount, name), node)
}

// checkNodeCgroup refuses a path that is not a node cgroup of the lab
// layout: the agent attaches socket hooks to it, and attaching them at
// the machine's root cgroup (or a lab's parent) would translate every
// connection of the machine.
func checkNodeCgroup(dir string) error {
	clean := filepath.Clean(dir)
	parent := filepath.Dir(clean)
	if filepath.Base(filepath.Dir(parent)) != CgroupSubdir || ValidateName(filepath.Base(parent)) != nil || filepath.Base(clean) == "" {
		return fmt.Errorf("cgroup %s is not a lab node's cgroup (<cgroup2>/%s/<lab>/<node>)", dir, CgroupSubdir)
	}
	return nil
}

// PodCgroupsParent is the directory under a node's cgroup that holds its
// pods' cgroups, the kubelet's cgroup root (cgroupfs driver).
const PodCgroupsParent = "kubepods"

// PodCgroupDir is where the lab kubelet runs a pod's container, laid out
// under the node's cgroup as the kubelet's cgroupfs driver lays pods out:
// kubepods/pod<uid>/<container> for a Guaranteed pod,
// kubepods/<burstable|besteffort>/pod<uid>/<container> otherwise. The
// agent's scan of --cgroup-root (pkg/cgroups) finds the pod by its UID
// there, so a socket-LB connection's flow names the pod.
func PodCgroupDir(nodeCgroup string, qos corev1.PodQOSClass, uid, container string) string {
	parent := filepath.Join(nodeCgroup, PodCgroupsParent)
	switch qos {
	case corev1.PodQOSGuaranteed:
	case corev1.PodQOSBurstable:
		parent = filepath.Join(parent, "burstable")
	default:
		parent = filepath.Join(parent, "besteffort")
	}
	return filepath.Join(parent, "pod"+uid, container)
}

// checkLabCgroup refuses a path that is neither a node cgroup of the lab
// layout nor a cgroup below one's pod cgroups (PodCgroupDir).
func checkLabCgroup(dir string) error {
	clean := filepath.Clean(dir)
	if checkNodeCgroup(clean) == nil {
		return nil
	}
	node, rest, ok := strings.Cut(clean, string(filepath.Separator)+PodCgroupsParent+string(filepath.Separator))
	if ok && rest != "" && checkNodeCgroup(node) == nil {
		return nil
	}
	return fmt.Errorf("cgroup %s is not a lab node's cgroup (<cgroup2>/%s/<lab>/<node>) nor one of its pods' (<node>/%s/…)", dir, CgroupSubdir, PodCgroupsParent)
}

// CreatePodCgroup makes a pod's container cgroup (PodCgroupDir) and its
// parents.
func CreatePodCgroup(dir string) error {
	if err := checkLabCgroup(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create cgroup %s: %w", dir, err)
	}
	return nil
}

// RemovePodCgroup removes a pod's cgroup (the parent of its container's,
// dir) with what is left in it; the kubepods/<qos> parents stay for the
// node's other pods.
func RemovePodCgroup(dir string) error {
	if err := checkLabCgroup(dir); err != nil {
		return err
	}
	pod := filepath.Dir(filepath.Clean(dir))
	if !strings.HasPrefix(filepath.Base(pod), "pod") || checkLabCgroup(pod) != nil {
		return fmt.Errorf("cgroup %s is not a pod's container cgroup", dir)
	}
	return removeCgroupTree(pod)
}

// CreateNodeCgroup makes a node's cgroup (and its parents).
func CreateNodeCgroup(dir string) error {
	if err := checkNodeCgroup(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create cgroup %s: %w", dir, err)
	}
	return nil
}

// EnterCgroup moves the calling process (every thread) into the cgroup
// dir (a node's or one of its pods'); what it starts afterwards starts there.
func EnterCgroup(dir string) error {
	if err := checkLabCgroup(dir); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte("0"), 0); err != nil {
		return fmt.Errorf("enter cgroup %s: %w", dir, err)
	}
	return nil
}

// EnterRootCgroup moves the calling process into the root of the cgroup2
// hierarchy, outside every node's cgroup: no node's socket
// load-balancing sees its connections, so a Service address it connects
// to is translated, if at all, per packet by the pod programs.
func EnterRootCgroup() error {
	mount, err := Cgroup2Mount()
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(mount, "cgroup.procs"), []byte("0"), 0); err != nil {
		return fmt.Errorf("enter the root cgroup %s: %w", mount, err)
	}
	return nil
}

// OpenCgroup opens a node's cgroup directory for CLONE_INTO_CGROUP
// (syscall.SysProcAttr.UseCgroupFD): the child starts inside it, with no
// moment in the parent's cgroup.
func OpenCgroup(dir string) (*os.File, error) {
	if err := checkLabCgroup(dir); err != nil {
		return nil, err
	}
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("open cgroup %s: %w", dir, err)
	}
	return f, nil
}

// cgroupPIDs lists the processes in a cgroup (cgroup.procs).
func cgroupPIDs(dir string) ([]int, error) {
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// removeLabCgroups kills what is left in the lab's node cgroups (every
// process there is the lab's: pod workloads, probes, lab exec commands),
// then removes the node cgroups, the lab's directory and, when no other
// lab uses it, the shared parent. It reports how many cgroups it removed.
func removeLabCgroups(mount, name string) (int, error) {
	labDir := LabCgroupDir(mount, name)
	entries, err := os.ReadDir(labDir)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("list %s: %w", labDir, err)
	}
	var errs []error
	removed := 0
	for _, e := range entries {
		if !e.IsDir() {
			continue // the cgroup's own interface files
		}
		dir := filepath.Join(labDir, e.Name())
		if err := removeCgroupTree(dir); err != nil {
			errs = append(errs, err)
			continue
		}
		removed++
	}
	if err := syscall.Rmdir(labDir); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("remove cgroup %s: %w", labDir, err))
	}
	// Fails (ENOTEMPTY/EBUSY) while another lab has cgroups there: fine.
	_ = syscall.Rmdir(filepath.Join(mount, CgroupSubdir))
	return removed, errors.Join(errs...)
}

// removeCgroupTree removes the cgroups below dir, deepest first, then dir
// itself (a cgroup with child cgroups cannot be removed: EBUSY).
func removeCgroupTree(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list %s: %w", dir, err)
	}
	var errs []error
	for _, e := range entries {
		if e.IsDir() {
			errs = append(errs, removeCgroupTree(filepath.Join(dir, e.Name())))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return removeCgroup(dir)
}

// removeCgroup kills the processes in dir and removes it once they are
// gone (a cgroup with members cannot be removed: EBUSY).
func removeCgroup(dir string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids, err := cgroupPIDs(dir)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		err = syscall.Rmdir(dir)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("remove cgroup %s (processes %v): %w", dir, pids, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
