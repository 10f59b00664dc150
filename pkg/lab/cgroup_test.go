package lab

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tendril-net/tendril/pkg/cgroups"
	"github.com/tendril-net/tendril/pkg/testutil"
)

func TestParseCgroup2Mount(t *testing.T) {
	mounts := `tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
`
	got, err := parseCgroup2Mount(strings.NewReader(mounts))
	if err != nil || got != "/sys/fs/cgroup/unified" {
		t.Fatalf("hybrid layout: %q, %v", got, err)
	}
	got, err = parseCgroup2Mount(strings.NewReader("cgroup2 /mnt/cg\\040two cgroup2 rw 0 0\n"))
	if err != nil || got != "/mnt/cg two" {
		t.Fatalf("escaped mount point: %q, %v", got, err)
	}
	if _, err := parseCgroup2Mount(strings.NewReader("cgroup /sys/fs/cgroup/cpu cgroup rw 0 0\n")); err == nil {
		t.Fatal("v1 only: no error")
	}
}

func TestCheckNodeCgroupRefusesAnythingElse(t *testing.T) {
	if err := checkNodeCgroup(NodeCgroupDir("/sys/fs/cgroup/unified", "tdrlab", "node1")); err != nil {
		t.Fatalf("a node cgroup refused: %v", err)
	}
	for _, dir := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup/unified/tendril-lab", "/sys/fs/cgroup/unified/tendril-lab/tdrlab",
		"/sys/fs/cgroup/unified/other/tdrlab/node1", "/sys/fs/cgroup/unified/tendril-lab/Bad-Name/node1", "/"} {
		if err := checkNodeCgroup(dir); err == nil {
			t.Errorf("%s accepted as a node cgroup", dir)
		}
		if err := EnterCgroup(dir); err == nil {
			t.Errorf("EnterCgroup(%s) accepted", dir)
		}
	}
}

// TestPrivilegedNodeCgroupLifecycle creates a node cgroup under the
// machine's cgroup2 mount, starts a process into it as the kubelet starts
// workloads, and checks that removing the lab's cgroups kills it and
// leaves no directory behind.
func TestPrivilegedNodeCgroupLifecycle(t *testing.T) {
	testutil.Privileged(t)
	mount, err := Cgroup2Mount()
	testutil.Require(t, err == nil, fmt.Sprintf("cgroup2 mount: %v", err))
	name := fmt.Sprintf("cgt%d", os.Getpid()%100000)
	t.Cleanup(func() { _, _ = removeLabCgroups(mount, name) })
	dir := NodeCgroupDir(mount, name, "node1")
	if err := CreateNodeCgroup(dir); err != nil {
		t.Fatal(err)
	}
	cgf, err := OpenCgroup(dir)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cgf.Fd())}
	err = cmd.Start()
	cgf.Close()
	if err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	own, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	want := "0::/" + filepath.Join(CgroupSubdir, name, "node1")
	if !strings.Contains(string(own), want) {
		t.Fatalf("child's cgroups %q lack %q", own, want)
	}
	pids, err := cgroupPIDs(dir)
	if err != nil || len(pids) != 1 || pids[0] != cmd.Process.Pid {
		t.Fatalf("cgroup.procs %v (%v), want [%d]", pids, err, cmd.Process.Pid)
	}
	n, err := removeLabCgroups(mount, name)
	if err != nil || n != 1 {
		t.Fatalf("removeLabCgroups: %d, %v", n, err)
	}
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Fatal("the process in the cgroup survived its removal")
	}
	if _, err := os.Stat(LabCgroupDir(mount, name)); !os.IsNotExist(err) {
		t.Fatalf("lab cgroup still there: %v", err)
	}
	if n, err := removeLabCgroups(mount, name); err != nil || n != 0 {
		t.Fatalf("second removal: %d, %v", n, err)
	}
}

func TestCheckLabCgroupAcceptsPodCgroups(t *testing.T) {
	node := NodeCgroupDir("/sys/fs/cgroup/unified", "tdrlab", "node1")
	for _, dir := range []string{node,
		PodCgroupDir(node, corev1.PodQOSBestEffort, "0f0e", "abc"),
		PodCgroupDir(node, corev1.PodQOSGuaranteed, "0f0e", "abc")} {
		if err := checkLabCgroup(dir); err != nil {
			t.Errorf("%s refused: %v", dir, err)
		}
	}
	if got, want := PodCgroupDir(node, corev1.PodQOSBurstable, "u", "c"), node+"/kubepods/burstable/podu/c"; got != want {
		t.Errorf("burstable: %s, want %s", got, want)
	}
	if got, want := PodCgroupDir(node, corev1.PodQOSGuaranteed, "u", "c"), node+"/kubepods/podu/c"; got != want {
		t.Errorf("guaranteed: %s, want %s", got, want)
	}
	for _, dir := range []string{"/sys/fs/cgroup/unified/kubepods/besteffort/podu/c",
		"/sys/fs/cgroup/unified/tendril-lab/tdrlab/kubepods/podu/c",
		node + "/kubepods/../../../../x", node + "/other/podu"} {
		if err := checkLabCgroup(dir); err == nil {
			t.Errorf("%s accepted", dir)
		}
	}
}

// TestPrivilegedPodCgroupNamesItsPod starts a process into a pod's cgroup
// below a node cgroup, as the lab kubelet starts workloads, and checks
// that the agent's scan of the node cgroup (its --cgroup-root) names the
// pod by the cgroup the process is in, and that the pod's removal and the
// lab's leave nothing behind.
func TestPrivilegedPodCgroupNamesItsPod(t *testing.T) {
	testutil.Privileged(t)
	mount, err := Cgroup2Mount()
	testutil.Require(t, err == nil, fmt.Sprintf("cgroup2 mount: %v", err))
	name := fmt.Sprintf("cgp%d", os.Getpid()%100000)
	t.Cleanup(func() { _, _ = removeLabCgroups(mount, name) })
	node := NodeCgroupDir(mount, name, "node1")
	if err := CreateNodeCgroup(node); err != nil {
		t.Fatal(err)
	}
	const uid = "5f1d8c1e-3a3b-4c7e-9b1a-0123456789ab"
	start := func(dir string) *exec.Cmd {
		t.Helper()
		if err := CreatePodCgroup(dir); err != nil {
			t.Fatal(err)
		}
		cgf, err := OpenCgroup(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer cgf.Close()
		cmd := exec.Command("sleep", "60")
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cgf.Fd())}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { _ = cmd.Wait() }()
		return cmd
	}
	dir := PodCgroupDir(node, corev1.PodQOSBestEffort, uid, "c0ffee")
	cmd := start(dir)
	own, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	rel, _ := filepath.Rel(mount, dir)
	if !strings.Contains(string(own), "0::/"+rel+"\n") {
		t.Fatalf("child's cgroups %q lack %q", own, rel)
	}
	id, err := cgroups.ID(dir)
	if err != nil {
		t.Fatal(err)
	}
	found, err := cgroups.Scan(node)
	if err != nil {
		t.Fatal(err)
	}
	named := false
	for _, c := range found {
		if c.ID == id && c.PodUID == uid && c.Container {
			named = true
		}
	}
	if !named {
		t.Fatalf("scan of %s: %+v, no container cgroup %d of pod %s", node, found, id, uid)
	}
	if err := RemovePodCgroup(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Dir(dir)); !os.IsNotExist(err) {
		t.Fatalf("pod cgroup still there: %v", err)
	}
	// A second pod left running: the lab's removal takes the whole tree.
	start(PodCgroupDir(node, corev1.PodQOSGuaranteed, uid, "c0ffee"))
	if n, err := removeLabCgroups(mount, name); err != nil || n != 1 {
		t.Fatalf("removeLabCgroups: %d, %v", n, err)
	}
	if _, err := os.Stat(LabCgroupDir(mount, name)); !os.IsNotExist(err) {
		t.Fatalf("lab cgroup still there: %v", err)
	}
}
