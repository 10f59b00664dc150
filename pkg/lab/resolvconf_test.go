package lab

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/tendril-net/tendril/pkg/testutil"
)

func TestResolvConf(t *testing.T) {
	got := ResolvConf("demo")
	want := "nameserver 10.96.0.10\nsearch demo.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n"
	if got != want {
		t.Fatalf("ResolvConf(demo) =\n%s\nwant\n%s", got, want)
	}
}

// onThrowawayThread runs fn on a locked thread that exits with the
// goroutine, so the mount namespace fn gives it never reaches another
// goroutine.
func onThrowawayThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		errc <- fn()
	}()
	return <-errc
}

func TestPrivilegedMountPodResolvConf(t *testing.T) {
	testutil.Privileged(t)
	machineBefore, err := os.ReadFile(MachineResolvConf)
	testutil.Require(t, err == nil, "the machine has no readable "+MachineResolvConf)
	dir := t.TempDir()
	pod := filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(pod, []byte(ResolvConf("demo")), 0o644); err != nil {
		t.Fatal(err)
	}

	var inside []byte
	var writeErr, catErr error
	var catOut []byte
	err = onThrowawayThread(func() error {
		if err := MountPodResolvConf(pod, MachineResolvConf); err != nil {
			return err
		}
		var err error
		inside, err = os.ReadFile(MachineResolvConf)
		if err != nil {
			return err
		}
		writeErr = os.WriteFile(MachineResolvConf, []byte("nameserver 192.0.2.1\n"), 0o644)
		// A process started from this thread inherits its mount namespace,
		// as `lab exec`'s command does.
		catOut, catErr = exec.Command("cat", MachineResolvConf).Output()
		return nil
	})
	if err != nil {
		t.Fatalf("MountPodResolvConf: %v", err)
	}
	if string(inside) != ResolvConf("demo") {
		t.Errorf("inside the mount namespace %s reads %q, want the pod's", MachineResolvConf, inside)
	}
	if catErr != nil || string(catOut) != ResolvConf("demo") {
		t.Errorf("a child of the thread reads %q (%v), want the pod's", catOut, catErr)
	}
	if writeErr == nil {
		t.Errorf("the pod's resolv.conf is writable through %s, want read-only", MachineResolvConf)
	}
	// What the rest of the machine sees, read by new processes: /proc/self
	// would show the main thread's view, and the Go runtime may have run
	// the throwaway goroutine on the main thread (which it then parks
	// rather than ends).
	machineAfter, err := exec.Command("cat", MachineResolvConf).Output()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(machineBefore, machineAfter) {
		t.Fatalf("the machine's %s changed:\nbefore %q\nafter  %q", MachineResolvConf, machineBefore, machineAfter)
	}
	// Nothing leaked into the machine's mount table.
	mounts, err := exec.Command("cat", "/proc/self/mountinfo").Output()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mounts), dir) {
		t.Fatalf("the bind mount of %s is visible in the machine's mount namespace:\n%s", pod, mounts)
	}
	if pod, _ := os.ReadFile(pod); string(pod) != ResolvConf("demo") {
		t.Fatalf("the pod's file changed: %q", pod)
	}
}

func TestPrivilegedMountPodResolvConfErrors(t *testing.T) {
	testutil.Privileged(t)
	dir := t.TempDir()
	pod := filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(pod, []byte(ResolvConf("x")), 0o644); err != nil {
		t.Fatal(err)
	}
	missingTarget := filepath.Join(dir, "etc", "resolv.conf")
	err := onThrowawayThread(func() error { return MountPodResolvConf(pod, missingTarget) })
	if err == nil || !strings.Contains(err.Error(), missingTarget) {
		t.Fatalf("missing target: %v, want an error naming it", err)
	}
	if _, err := os.Stat(missingTarget); err == nil {
		t.Fatalf("%s was created", missingTarget)
	}
	err = onThrowawayThread(func() error { return MountPodResolvConf(filepath.Join(dir, "nope"), MachineResolvConf) })
	if err == nil || !strings.Contains(err.Error(), "pod resolv.conf") {
		t.Fatalf("missing pod file: %v, want an error", err)
	}
}
