package realnode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Binaries are the node software's executables (hack/node-binaries.sh).
type Binaries struct {
	Kubelet, Containerd, Ctr string
	// Scheduler is kube-scheduler: the lab's control plane has none, and
	// a real node's DaemonSet and Deployment pods need one.
	Scheduler string
	// Shim is containerd-shim-runc-v2: containerd finds it on PATH by
	// that name, so the node's PATH starts with ShimDir (a directory of
	// links named as containerd expects).
	Shim string
	// Loopback is the reference loopback CNI plugin: containerd's CRI
	// runs it in every pod sandbox, from the node's CNI bin dir.
	Loopback string
}

// Versions pinned by hack/node-binaries.sh.
const (
	KubeletVersion    = "v1.36.3"
	ContainerdVersion = "v2.2.1"
	CNIPluginsVersion = "v1.9.1"
)

// BinariesIn names the pinned binaries in the cache directory dir.
func BinariesIn(dir string) Binaries {
	return Binaries{
		Kubelet:    filepath.Join(dir, "kubelet-"+KubeletVersion),
		Scheduler:  filepath.Join(dir, "kube-scheduler-"+KubeletVersion),
		Containerd: filepath.Join(dir, "containerd-"+ContainerdVersion),
		Ctr:        filepath.Join(dir, "ctr-"+ContainerdVersion),
		Shim:       filepath.Join(dir, "containerd-shim-runc-v2-"+ContainerdVersion),
		Loopback:   filepath.Join(dir, "cni-plugins-"+CNIPluginsVersion, "loopback"),
	}
}

// Missing lists the binaries (and runc) that are not there.
func (b Binaries) Missing() []string {
	var missing []string
	for _, p := range []string{b.Kubelet, b.Scheduler, b.Containerd, b.Ctr, b.Shim, b.Loopback} {
		if _, err := os.Stat(p); err != nil {
			missing = append(missing, filepath.Base(p))
		}
	}
	if _, err := exec.LookPath("runc"); err != nil {
		missing = append(missing, "runc")
	}
	return missing
}

// kernelTunables are the sysctls the kubelet sets at start when
// protectKernelDefaults is off (its container manager's
// setupKernelTunables): machine-wide settings, so in the node's mount
// namespace each is a file of the node's own bound over /proc/sys.
var kernelTunables = []string{
	"vm/overcommit_memory",
	"vm/panic_on_oom",
	"kernel/panic",
	"kernel/panic_on_oops",
	"kernel/keys/root_maxkeys",
	"kernel/keys/root_maxbytes",
}

// hostPaths are the machine's paths a node's pods, CNI and containerd use
// that must be the node's own, keyed by the machine's path: the chart's
// agent DaemonSet mounts them as hostPath volumes (its init container
// installs tendril-cni and its network configuration in the CNI dirs; the
// agent pins its maps in bpffs, keeps its state and socket in
// /var/run/tendril, finds pod namespaces in /var/run/netns, attaches
// socket load-balancing at its cgroup root), and containerd makes the pod
// network namespaces in /var/run/netns and its shims their sockets under
// /run/containerd.
func (n Node) hostPaths() map[string]string {
	m := map[string]string{
		"/opt/cni/bin":     n.CNIBinDir(),
		"/etc/cni/net.d":   n.CNIConfDir(),
		"/var/run/tendril": n.TendrilRunDir(),
		"/var/run/netns":   n.NetnsDir(),
		// The userspace WireGuard devices' UAPI sockets (the chart's
		// hostPath with encryption on): one device name on every node,
		// each node's socket its own.
		"/var/run/wireguard": n.WireGuardRunDir(),
		// The shims' sockets (/run/containerd/s/<hash>) and fifos: a
		// killed shim leaves its socket behind, in the node's directory
		// rather than the machine's.
		"/run/containerd": filepath.Join(n.Dir, "run-containerd"),
	}
	if n.BPFDir != "" {
		m["/sys/fs/bpf"] = n.BPFDir
	}
	if n.AgentCgroupPath != "" && n.Cgroup2Dir != "" {
		m[n.AgentCgroupPath] = n.Cgroup2Dir
	}
	return m
}

// Prepare makes the node's directories, configurations, cgroupRoot and
// mount namespace. clientCAFile is the API server's client CA (the
// kubelet authenticates its callers with it).
func Prepare(ctx context.Context, n Node, b Binaries, clientCAFile string) error {
	for _, d := range []string{n.ContainerdRoot(), n.ContainerdState(), n.RuncRoot(), n.KubeletDir(),
		n.PodLogsDir(), n.CNIBinDir(), n.CNIConfDir(), n.SysctlDir(), n.shimDir(),
		n.TendrilRunDir(), n.NetnsDir(), n.WireGuardRunDir(), filepath.Join(n.Dir, "run-containerd")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	if err := os.WriteFile(n.ContainerdConfig(), []byte(ContainerdConfigTOML(n)), 0o644); err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	if err := os.WriteFile(n.KubeletConfig(), []byte(KubeletConfigYAML(n, clientCAFile)), 0o644); err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	for link, target := range map[string]string{
		filepath.Join(n.shimDir(), "containerd-shim-runc-v2"): b.Shim,
		filepath.Join(n.CNIBinDir(), "loopback"):              b.Loopback,
	} {
		_ = os.Remove(link)
		if err := os.Symlink(target, link); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	hs, err := Hierarchies()
	if err != nil {
		return err
	}
	if err := PrepareCgroupRoot(hs, n.CgroupRoot); err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	if n.BPFDir != "" {
		if err := os.MkdirAll(n.BPFDir, 0o755); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	return createMountNamespace(ctx, n)
}

func (n Node) shimDir() string { return filepath.Join(n.Dir, "bin") }

// nsDir holds the mount namespace's file; it is a private bind mount of
// itself (a mount namespace can be kept in a file only on a mount that
// does not propagate).
func (n Node) nsDir() string { return filepath.Join(n.Dir, "ns") }

// createMountNamespace makes the node's mount namespace, kept open by a
// bind mount of it on MountNamespace(), and mounts in it the node's own
// files over the kernel settings the kubelet writes and the node's own
// directories over the host paths of hostPaths.
func createMountNamespace(ctx context.Context, n Node) error {
	if err := os.MkdirAll(n.nsDir(), 0o755); err != nil {
		return err
	}
	if err := unix.Mount(n.nsDir(), n.nsDir(), "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("node %s: bind %s: %w", n.Name, n.nsDir(), err)
	}
	if err := unix.Mount("", n.nsDir(), "", unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("node %s: make %s private: %w", n.Name, n.nsDir(), err)
	}
	if err := os.WriteFile(n.MountNamespace(), nil, 0o644); err != nil {
		return err
	}
	// What the new namespace mounts stays in it (--propagation private):
	// the machine never sees the node's binds.
	if err := run(ctx, "unshare", "--mount="+n.MountNamespace(), "--propagation", "private", "true"); err != nil {
		return fmt.Errorf("node %s: create its mount namespace: %w", n.Name, err)
	}
	for _, t := range kernelTunables {
		cur, err := os.ReadFile(filepath.Join("/proc/sys", t))
		if err != nil {
			return fmt.Errorf("node %s: read sysctl %s: %w", n.Name, t, err)
		}
		f := filepath.Join(n.SysctlDir(), strings.ReplaceAll(t, "/", "."))
		if err := os.WriteFile(f, cur, 0o644); err != nil {
			return err
		}
		if err := n.inMountNS(ctx, "mount", "--bind", f, filepath.Join("/proc/sys", t)); err != nil {
			return fmt.Errorf("node %s: shield sysctl %s: %w", n.Name, t, err)
		}
	}
	paths := n.hostPaths()
	hosts := make([]string, 0, len(paths))
	for h := range paths {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	for _, host := range hosts {
		own := paths[host]
		if err := os.MkdirAll(host, 0o755); err != nil {
			return err
		}
		if err := n.inMountNS(ctx, "mount", "--bind", own, host); err != nil {
			return fmt.Errorf("node %s: bind %s over %s: %w", n.Name, own, host, err)
		}
	}
	// Inside, every mount shared, as on a systemd machine: the chart's
	// hostPath volumes with HostToContainer propagation (bpffs, the netns
	// dir, the cgroup) need a shared or slave source. Turning a private
	// mount shared makes a peer group of the node's own: nothing reaches
	// the machine.
	if err := n.inMountNS(ctx, "mount", "--make-rshared", "/"); err != nil {
		return fmt.Errorf("node %s: make its mounts shared: %w", n.Name, err)
	}
	return nil
}

func (n Node) inMountNS(ctx context.Context, argv ...string) error {
	return run(ctx, append([]string{"nsenter", "--mount=" + n.MountNamespace()}, argv...)...)
}

func run(ctx context.Context, argv ...string) error {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// enter is the prefix that runs a command in the node's mount and network
// namespaces with the node's PATH (the shim first, then the machine's,
// where runc is).
func (n Node) enter() []string {
	return []string{"nsenter", "--mount=" + n.MountNamespace(), "--net=" + n.NetnsPath,
		"env", "PATH=" + n.shimDir() + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
}

// ContainerdArgv runs the node's containerd.
func ContainerdArgv(n Node, b Binaries) []string {
	return append(append(n.enter(), b.Containerd), ContainerdArgs(n)...)
}

// KubeletArgv runs the node's kubelet.
func KubeletArgv(n Node, b Binaries) []string {
	return append(append(n.enter(), b.Kubelet), KubeletArgs(n)...)
}

// Ctr runs ctr against the node's containerd (in the k8s.io namespace,
// the CRI's) and returns its output.
func Ctr(ctx context.Context, n Node, b Binaries, args ...string) (string, error) {
	argv := append(append(n.enter(), b.Ctr, "--address", n.ContainerdSocket(), "--namespace", "k8s.io"), args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("node %s: ctr %s: %w: %s", n.Name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

// WaitContainerd waits until the node's containerd answers.
func WaitContainerd(ctx context.Context, n Node, b Binaries, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := Ctr(cctx, n, b, "version")
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("node %s: containerd does not answer after %s: %w", n.Name, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// ImportImages imports OCI image archives into the node's containerd
// (the CRI's namespace), with no registry involved.
func ImportImages(ctx context.Context, n Node, b Binaries, archives ...string) error {
	for _, a := range archives {
		if _, err := Ctr(ctx, n, b, "images", "import", "--no-unpack=false", a); err != nil {
			return err
		}
	}
	return nil
}

// Teardown removes what the node's software made once its processes are
// gone: the mount namespace (with every mount the kubelet, containerd and
// runc made in it), the private bind of its directory, and the cgroups
// under the node's cgroupRoot. It is idempotent.
func Teardown(n Node) error {
	var errs []error
	var hs []Hierarchy
	if n.CgroupRoot != "" {
		var err error
		if hs, err = Hierarchies(); err != nil {
			errs = append(errs, err)
		} else if _, err := KillCgroupRoot(hs, n.CgroupRoot, 10*time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	if err := unix.Unmount(n.MountNamespace(), unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, fmt.Errorf("node %s: unmount its mount namespace: %w", n.Name, err))
	}
	if err := unix.Unmount(n.nsDir(), unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, fmt.Errorf("node %s: unmount %s: %w", n.Name, n.nsDir(), err))
	}
	if len(hs) > 0 {
		if _, err := RemoveCgroupRoot(hs, n.CgroupRoot); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
