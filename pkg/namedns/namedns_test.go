package namedns

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/testutil"
)

// childEnv marks the re-executed test binary that runs a scenario inside a
// private mount namespace, where /run is a fresh tmpfs and so /run/netns a
// plain directory, as on a fresh machine. Nothing it mounts leaks out.
const childEnv = "TENDRIL_NAMEDNS_SCENARIO"

// inPrivateMounts runs the named test again inside `unshare --mount` and
// fails with its output when it fails; it reports true in the child.
func inPrivateMounts(t *testing.T) bool {
	t.Helper()
	if os.Getenv(childEnv) == t.Name() {
		if err := unix.Mount("tmpfs", "/run", "tmpfs", 0, "mode=0755"); err != nil {
			t.Fatalf("mount a tmpfs on /run: %v", err)
		}
		return true
	}
	testutil.Privileged(t)
	_, err := exec.LookPath("ip")
	testutil.Require(t, err == nil, "iproute2's ip not found")
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "--",
		os.Args[0], "-test.run", "^"+t.Name()+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+t.Name())
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatalf("scenario in a private mount namespace: %v\n%s", err, out)
	}
	return false
}

func ipNetns(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", append([]string{"netns"}, args...)...).CombinedOutput(); err != nil {
		t.Fatalf("ip netns %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func mustBeNamespace(t *testing.T, name string, want bool) {
	t.Helper()
	_, statErr := os.Stat(Path(name))
	if got := isNsfs(Path(name)); got != want {
		t.Fatalf("%s mounted = %v, want %v (stat: %v)", Path(name), got, want, statErr)
	}
	if !want && statErr == nil {
		t.Fatalf("%s still exists", Path(name))
	}
}

// TestPrivilegedCreateThenIPNetnsAdd: namespaces made by Create stay
// removable after `ip netns add` (which covers a plain /run/netns with a
// bind mount of itself).
func TestPrivilegedCreateThenIPNetnsAdd(t *testing.T) {
	if !inPrivateMounts(t) {
		return
	}
	for _, n := range []string{"lab-a", "lab-b"} {
		if err := Create(n); err != nil {
			t.Fatal(err)
		}
	}
	ipNetns(t, "add", "other")
	for _, n := range []string{"lab-a", "lab-b"} {
		if err := Delete(n); err != nil {
			t.Fatal(err)
		}
		mustBeNamespace(t, n, false)
	}
	mustBeNamespace(t, "other", true)
	if err := Delete("lab-a"); err != nil {
		t.Fatalf("deleting a missing namespace: %v", err)
	}
}

// TestPrivilegedDeleteUnderCover: namespaces mounted on a plain /run/netns
// by an older tool, then covered by `ip netns add`, are removed by Delete,
// and the other tool's namespace is kept.
func TestPrivilegedDeleteUnderCover(t *testing.T) {
	if !inPrivateMounts(t) {
		return
	}
	for _, n := range []string{"old-a", "old-b"} {
		h, err := netns.NewNamed(n) // plain directory mounts, no shared bind
		if err != nil {
			t.Fatal(err)
		}
		_ = h.Close()
	}
	ipNetns(t, "add", "other")
	// What lab down did before: unmount the path, remove the file: EBUSY.
	if err := unmountAndRemove(Path("old-a")); err == nil {
		t.Fatal("the trap did not reproduce: removing a covered namespace file succeeded")
	}
	for _, n := range []string{"old-a", "old-b"} {
		if err := Delete(n); err != nil {
			t.Fatal(err)
		}
		mustBeNamespace(t, n, false)
	}
	mustBeNamespace(t, "other", true)
	// The other tool's namespace still works with its own tool.
	ipNetns(t, "exec", "other", "true")
	ipNetns(t, "del", "other")
	mustBeNamespace(t, "other", false)
}

// TestPrivilegedInNetnsLeavesTheMainThread: InNetns must not leave the
// process's main thread in the namespace it entered. The runtime cannot
// end the main thread as it ends other locked threads; it parks it for
// good, still inside the namespace, and /proc/<pid>/ns/net (the main
// thread's) then names that namespace: `tendril lab down` kills every
// process "inside" a lab namespace, and a parked thread keeps a deleted
// pod namespace (and its veth) alive. Many calls in parallel, so some run
// on the main thread.
func TestPrivilegedInNetnsLeavesTheMainThread(t *testing.T) {
	testutil.Privileged(t)
	name := fmt.Sprintf("tdrmain%d", os.Getpid())
	if err := Create(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Delete(name) })
	var want, inside unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", os.Getpid()), &want); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(Path(name), &inside); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 2000 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = InNetns(Path(name), func() error { time.Sleep(time.Millisecond); return nil })
		}()
	}
	wg.Wait()
	// Park-and-wedge happens as the goroutines exit; give the runtime a
	// moment, then look at the main thread.
	runtime.GC()
	var got unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", os.Getpid()), &got); err != nil {
		t.Fatal(err)
	}
	if got.Ino != want.Ino {
		t.Fatalf("the main thread is in another network namespace after InNetns (inode %d, the test's namespace is %d, the process's was %d)",
			got.Ino, inside.Ino, want.Ino)
	}
}

// TestPrivilegedForwardInto: a server on this namespace's loopback
// answers a client inside another namespace at the same address.
func TestPrivilegedForwardInto(t *testing.T) {
	testutil.Privileged(t)
	name := fmt.Sprintf("tdrfwd%d", os.Getpid())
	if err := Create(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Delete(name) })
	srv, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	go func() {
		for {
			c, err := srv.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("hello"))
			_ = c.Close()
		}
	}()
	fwd, err := ForwardInto(Path(name), srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer fwd.Close()
	var got []byte
	err = InNetns(Path(name), func() error {
		c, err := net.Dial("tcp", srv.Addr().String())
		if err != nil {
			return err
		}
		defer c.Close()
		got, err = io.ReadAll(c)
		return err
	})
	if err != nil || string(got) != "hello" {
		t.Fatalf("through the forward: %q, %v", got, err)
	}
}
