// Package namedns creates and removes named network namespaces under
// /run/netns the way iproute2 does, so that they live side by side with
// `ip netns add` and friends.
//
// iproute2 makes /run/netns a shared mount of itself before it mounts a
// namespace there. A tool that mounts namespaces on files in a plain
// /run/netns directory (as github.com/vishvananda/netns does) leaves a trap:
// the next `ip netns add` bind-mounts the directory over itself, and every
// earlier mount ends up underneath, out of reach of its path: unmounting
// the path removes only the copy on top and removing the file answers
// EBUSY. Create avoids making that state; Delete recovers from it.
package namedns

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// RunDir is where named network namespaces are mounted.
const RunDir = "/run/netns"

// Path is where the named namespace is mounted.
func Path(name string) string { return filepath.Join(RunDir, name) }

// AgentScoped is the name of a namespace an agent keeps for itself (its
// health endpoint's): prefix, the node's name and a hash of the agent's
// state directory, so that agents of different labs whose nodes have the
// same names (node1, ...) on one machine never share one, and `lab down`
// finds a lab node's by its state directory.
func AgentScoped(prefix, node, stateDir string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(stateDir)))
	return prefix + node + "-" + hex.EncodeToString(sum[:4])
}

// EnsureRunDir makes RunDir a shared mount of itself, as `ip netns add`
// does before its first namespace, so that later mounts in it propagate
// and no later bind mount of the directory covers them.
func EnsureRunDir() error {
	if err := os.MkdirAll(RunDir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", RunDir, err)
	}
	bound := false
	for {
		err := unix.Mount("", RunDir, "none", unix.MS_SHARED|unix.MS_REC, "")
		if err == nil {
			return nil
		}
		// EINVAL: not a mount point yet. Make it one, once.
		if !errors.Is(err, unix.EINVAL) || bound {
			return fmt.Errorf("make %s a shared mount: %w", RunDir, err)
		}
		if err := unix.Mount(RunDir, RunDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind-mount %s on itself: %w", RunDir, err)
		}
		bound = true
	}
}

// InNetns runs fn on a thread inside the network namespace at path. Sockets
// fn creates stay in that namespace and may be used from any goroutine
// afterwards.
func InNetns(path string, fn func() error) error {
	return onThrowawayThread(func() error {
		ns, err := netns.GetFromPath(path)
		if err != nil {
			return fmt.Errorf("open network namespace %s: %w", path, err)
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			return fmt.Errorf("enter network namespace %s: %w", path, err)
		}
		return fn()
	})
}

// onThrowawayThread runs fn on a locked OS thread: fn may change the
// thread's network namespace. Afterwards the thread goes back to the
// process's namespace and to the scheduler; only when that fails is it
// left locked, to die with the goroutine instead of carrying the
// namespace elsewhere. Returning it matters for the main thread: the
// runtime cannot end that one, it parks it for good, and a main thread
// parked inside a namespace makes /proc/<pid>/ns/net name it (`lab down`
// then kills the process as one inside the lab) and keeps the namespace,
// with its interfaces, alive after it is deleted.
func onThrowawayThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("the thread's network namespace: %w", err)
			return
		}
		defer orig.Close()
		err = fn()
		// Back first, then answer: a caller that looks at the process's
		// namespace (/proc/<pid>/ns/net is the main thread's) right after
		// must not find this thread still inside.
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// Create makes a new network namespace mounted at Path(name), with its
// loopback up. An existing name is an error.
func Create(name string) error {
	if err := EnsureRunDir(); err != nil {
		return err
	}
	path := Path(name)
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0)
	if err != nil {
		return fmt.Errorf("create network namespace %s: %w", name, err)
	}
	_ = f.Close()
	err = onThrowawayThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unshare: %w", err)
		}
		self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		if err := unix.Mount(self, path, "none", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("mount on %s: %w", path, err)
		}
		lo, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetUp(lo)
		}
		if err != nil {
			return fmt.Errorf("loopback up: %w", err)
		}
		return nil
	})
	if err != nil {
		_ = unix.Unmount(path, unix.MNT_DETACH)
		_ = os.Remove(path)
		return fmt.Errorf("create network namespace %s: %w", name, err)
	}
	return nil
}

// Delete unmounts and removes the named namespace; a missing one is no
// error. The namespace itself goes once nothing holds it. When the mount
// sits under a cover (see the package doc), the cover is taken off and
// RunDir rebuilt with every other namespace in it kept.
func Delete(name string) error {
	path := Path(name)
	err := unmountAndRemove(path)
	if errors.Is(err, unix.EBUSY) {
		if rerr := Rebuild(); rerr != nil {
			return fmt.Errorf("delete network namespace %s: %w (and recovering the mounts under %s: %v)", name, err, RunDir, rerr)
		}
		err = unmountAndRemove(path)
	}
	if err != nil {
		return fmt.Errorf("delete network namespace %s: %w", name, err)
	}
	return nil
}

func unmountAndRemove(path string) error {
	// Unmount every mount stacked on the path: a mount can be there twice.
	for range 8 {
		if err := unix.Unmount(path, unix.MNT_DETACH); err != nil {
			break
		}
	}
	err := os.Remove(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// List names the namespaces in RunDir that start with prefix.
func List(prefix string) ([]string, error) {
	entries, err := os.ReadDir(RunDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list network namespaces: %w", err)
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// Rebuild takes every bind mount of RunDir on itself off (the covers), then
// makes RunDir one shared mount of itself again with every namespace that
// was reachable at any layer mounted back on its file: the top-most layer's
// namespace wins for a name. It recovers the state described in the package
// doc without losing another tool's namespaces.
func Rebuild() error {
	held := map[string]*os.File{}
	defer func() {
		for _, f := range held {
			_ = f.Close()
		}
	}()
	holdLayer := func() error {
		entries, err := os.ReadDir(RunDir)
		if err != nil {
			return fmt.Errorf("read %s: %w", RunDir, err)
		}
		for _, e := range entries {
			if _, ok := held[e.Name()]; ok {
				continue
			}
			p := Path(e.Name())
			if !isNsfs(p) {
				continue
			}
			f, err := os.Open(p)
			if err != nil {
				return fmt.Errorf("hold network namespace %s: %w", e.Name(), err)
			}
			held[e.Name()] = f
		}
		return nil
	}
	for range 16 {
		if err := holdLayer(); err != nil {
			return err
		}
		covered, err := isSelfBind()
		if err != nil {
			return err
		}
		if !covered {
			break
		}
		if err := unix.Unmount(RunDir, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount the cover of %s: %w", RunDir, err)
		}
	}
	// What is left are namespaces mounted on files of the plain directory;
	// they are held, so take them off and mount them back above the new
	// shared mount, where their paths reach them.
	for name := range held {
		for range 8 {
			if err := unix.Unmount(Path(name), unix.MNT_DETACH); err != nil {
				break
			}
		}
	}
	if err := EnsureRunDir(); err != nil {
		return err
	}
	var errs []error
	for name, f := range held {
		p := Path(name)
		if fd, err := os.OpenFile(p, os.O_RDONLY|os.O_CREATE, 0); err == nil {
			_ = fd.Close()
		}
		src := fmt.Sprintf("/proc/self/fd/%d", f.Fd())
		if err := unix.Mount(src, p, "none", unix.MS_BIND, ""); err != nil {
			errs = append(errs, fmt.Errorf("mount network namespace %s back: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// isNsfs reports whether path is a mounted namespace file.
func isNsfs(path string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false
	}
	return st.Type == unix.NSFS_MAGIC
}

// isSelfBind reports whether the top mount at RunDir is a bind mount of the
// directory itself (what `ip netns add` or EnsureRunDir makes), not a file
// system of its own, which must never be taken off.
func isSelfBind() (bool, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false, fmt.Errorf("read mountinfo: %w", err)
	}
	defer f.Close()
	// The mount that the path reaches: mountinfo also lists mounts that
	// other mounts hide (a tmpfs on /run hides the /run/netns below it).
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, RunDir, 0, unix.STATX_MNT_ID, &stx); err != nil {
		return false, fmt.Errorf("statx %s: %w", RunDir, err)
	}
	visible := fmt.Sprint(stx.Mnt_id)
	type mount struct{ id, parent, dev, root, point string }
	byID := map[string]mount{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		m := mount{id: fields[0], parent: fields[1], dev: fields[2], root: fields[3], point: unescape(fields[4])}
		byID[m.id] = m
	}
	if err := sc.Err(); err != nil {
		return false, fmt.Errorf("read mountinfo: %w", err)
	}
	top, ok := byID[visible]
	if !ok || top.point != RunDir {
		return false, nil // not a mount point: the path reaches its parent's mount
	}
	parent, ok := byID[top.parent]
	if !ok {
		return false, nil
	}
	// A self bind shows the same device as what it covers, and a root that
	// names the netns directory inside that file system.
	return top.dev == parent.dev && strings.HasSuffix(top.root, "/netns"), nil
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			ok := true
			for _, c := range s[i+1 : i+4] {
				if c < '0' || c > '7' {
					ok = false
					break
				}
				v = v*8 + byte(c-'0')
			}
			if ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// ForwardInto makes addr (a TCP address of this process's namespace)
// reachable at the same address inside the network namespace at path: a
// listener there whose connections are spliced to addr. Closing the
// listener ends the forward (open connections run to their end).
func ForwardInto(path, addr string) (net.Listener, error) {
	var ln net.Listener
	if err := InNetns(path, func() (err error) { ln, err = net.Listen("tcp", addr); return err }); err != nil {
		return nil, err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				up, err := net.Dial("tcp", addr)
				if err != nil {
					return
				}
				defer up.Close()
				go func() { _, _ = io.Copy(up, c); _ = up.Close() }()
				_, _ = io.Copy(c, up)
			}()
		}
	}()
	return ln, nil
}
