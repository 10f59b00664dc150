// Package realnode runs a lab node as real Kubernetes node software: the
// upstream kubelet and containerd (with runc), both built or installed by
// hack/node-binaries.sh, for `tendril lab up --runtime containerd`.
//
// Each node keeps everything of its own under its directory: containerd's
// root, state, socket and runc root; the kubelet's root, pod logs and
// certificates; the CNI bin and conf dirs the chart's init container
// installs tendril-cni into. Both daemons run in the node's network
// namespace and in a mount namespace of the node's own (see mountns.go):
// the kubelet's and runc's mounts live and die with it, and the kernel
// settings the kubelet would change machine-wide (kernel.panic and the
// like) are files of that namespace, not the machine's.
package realnode

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
)

// Node is one real lab node.
type Node struct {
	// Name is the lab node's name, and the Kubernetes Node's.
	Name string
	// Dir holds everything of the node (see the accessors below).
	Dir string
	// NetnsPath is the node's network namespace (a /run/netns file).
	NetnsPath string
	// Address is the node's InternalIP.
	Address string
	// Address6 is the node's IPv6 InternalIP in a dual-stack lab (empty
	// otherwise): the kubelet registers the Node with both, IPv4 first.
	Address6 string
	// Kubeconfig reaches the API server from inside the node's network
	// namespace.
	Kubeconfig string
	// CgroupRoot is the kubelet's cgroupRoot, a path relative to each
	// cgroup hierarchy's root ("/tendril-lab.<lab>.<node>"): created in
	// every hierarchy before the kubelet starts, removed on teardown.
	CgroupRoot string
	// BPFDir is the node's directory in bpffs: in the node's mount
	// namespace it is /sys/fs/bpf, where the agent pod's hostPath volume
	// pins its maps.
	BPFDir string
	// Cgroup2Dir is the node's cgroup v2 directory (the unified
	// hierarchy's <mount>/<CgroupRoot>): the node's pods' cgroups are
	// under it, and in the node's mount namespace it is bound at
	// AgentCgroupPath, the agent's cgroup root.
	Cgroup2Dir string
	// AgentCgroupPath is where, in the node's mount namespace, Cgroup2Dir
	// is bound: the chart's agent.cgroupRoot (one value for every node,
	// each node's own cgroup behind it). It must exist on the machine.
	AgentCgroupPath string
	// PauseImage is the pod sandbox image's name in containerd's store.
	PauseImage string
	// ClusterDNS and ClusterDomain are given to the pods.
	ClusterDNS    string
	ClusterDomain string
}

// Paths of the node, all under Dir.
func (n Node) ContainerdDir() string      { return filepath.Join(n.Dir, "containerd") }
func (n Node) ContainerdConfig() string   { return filepath.Join(n.ContainerdDir(), "config.toml") }
func (n Node) ContainerdSocket() string   { return filepath.Join(n.ContainerdDir(), "containerd.sock") }
func (n Node) ContainerdRoot() string     { return filepath.Join(n.ContainerdDir(), "root") }
func (n Node) ContainerdState() string    { return filepath.Join(n.ContainerdDir(), "state") }
func (n Node) RuncRoot() string           { return filepath.Join(n.ContainerdDir(), "runc") }
func (n Node) KubeletDir() string         { return filepath.Join(n.Dir, "kubelet") }
func (n Node) KubeletConfig() string      { return filepath.Join(n.Dir, "kubelet-config.yaml") }
func (n Node) PodLogsDir() string         { return filepath.Join(n.Dir, "pod-logs") }
func (n Node) CNIBinDir() string          { return filepath.Join(n.Dir, "cni", "bin") }
func (n Node) CNIConfDir() string         { return filepath.Join(n.Dir, "cni", "net.d") }
func (n Node) MountNamespace() string     { return filepath.Join(n.Dir, "mntns") }
func (n Node) TendrilRunDir() string      { return filepath.Join(n.Dir, "tendril-run") }
func (n Node) NetnsDir() string           { return filepath.Join(n.Dir, "netns") }
func (n Node) WireGuardRunDir() string    { return filepath.Join(n.Dir, "wireguard") }
func (n Node) SysctlDir() string          { return filepath.Join(n.Dir, "sysctl") }
func (n Node) ContainerdEndpoint() string { return "unix://" + n.ContainerdSocket() }

// TaskBundleSpec is the OCI runtime spec (config.json) containerd's runc
// shim runs the container id of the CRI's namespace k8s.io from.
func (n Node) TaskBundleSpec(id string) string {
	return filepath.Join(n.ContainerdState(), "io.containerd.runtime.v2.task", "k8s.io", id, "config.json")
}

// tomlString quotes s for TOML (a basic string).
func tomlString(s string) string { return strconv.Quote(s) }

// ContainerdConfigTOML is the node's containerd configuration (version 3,
// containerd 2.x): its own root, state and socket; the CRI plugin with the
// node's CNI dirs and the lab's pause image as the sandbox image; runc
// with cgroupfs (SystemdCgroup off: no systemd manages these cgroups) and
// a runc root of the node's own. NRI is off: its socket is one path for the
// whole machine, and several nodes' containerds share the machine.
// Nothing listens on TCP: the CRI streaming server (exec, logs -f) is on
// the node namespace's loopback. OOM score adjustments are kept no lower
// than containerd's own: the kubelet asks -998 for every pod sandbox, and
// lowering a score needs CAP_SYS_RESOURCE, which a lab machine (a
// container itself, as here) may not have: runc then fails with "can't
// get final child's PID from pipe" (its init could not write
// /proc/self/oom_score_adj).
func ContainerdConfigTOML(n Node) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	p("# Written by tendril lab (pkg/lab/realnode) for node %s.", n.Name)
	p("version = 3")
	p("root = %s", tomlString(n.ContainerdRoot()))
	p("state = %s", tomlString(n.ContainerdState()))
	p(`disabled_plugins = ["io.containerd.nri.v1.nri"]`)
	p("")
	p("[grpc]")
	p("  address = %s", tomlString(n.ContainerdSocket()))
	p("")
	p("[ttrpc]")
	p("  address = %s", tomlString(n.ContainerdSocket()+".ttrpc"))
	p("")
	p(`[plugins."io.containerd.cri.v1.images"]`)
	p(`  snapshotter = "overlayfs"`)
	p(`  [plugins."io.containerd.cri.v1.images".pinned_images]`)
	p("    sandbox = %s", tomlString(n.PauseImage))
	p("")
	p(`[plugins."io.containerd.cri.v1.runtime"]`)
	p(`  restrict_oom_score_adj = true`)
	p(`  [plugins."io.containerd.cri.v1.runtime".containerd]`)
	p(`    default_runtime_name = "runc"`)
	p(`    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]`)
	p(`      runtime_type = "io.containerd.runc.v2"`)
	p(`      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]`)
	p(`        SystemdCgroup = false`)
	p("        Root = %s", tomlString(n.RuncRoot()))
	p(`  [plugins."io.containerd.cri.v1.runtime".cni]`)
	p("    bin_dirs = [%s]", tomlString(n.CNIBinDir()))
	p("    conf_dir = %s", tomlString(n.CNIConfDir()))
	p("")
	p(`[plugins."io.containerd.grpc.v1.cri"]`)
	p(`  disable_tcp_service = true`)
	p(`  stream_server_address = "127.0.0.1"`)
	p(`  stream_server_port = "0"`)
	return b.String()
}

// KubeletConfigYAML is the node's KubeletConfiguration. What this machine
// needs (docs/containerd-lab-status.md, FACTS): failCgroupV1 false (the
// machine has a hybrid cgroup layout: v1 controllers, cgroup2 beside
// them), the cgroupfs driver, and a cgroupRoot of the node's own, made
// beforehand in every v1 hierarchy (PrepareCgroupRoot). Authentication
// takes the API server's client certificates (its CA); authorization is
// AlwaysAllow because only the node namespace's loopback and the lab
// bridge reach the kubelet's port. Eviction thresholds are off: the nodes
// share one machine's memory and disk, which no node owns.
func KubeletConfigYAML(n Node, clientCAFile string) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	p("# Written by tendril lab (pkg/lab/realnode) for node %s.", n.Name)
	p("apiVersion: kubelet.config.k8s.io/v1beta1")
	p("kind: KubeletConfiguration")
	p("failCgroupV1: false")
	p("cgroupDriver: cgroupfs")
	p("cgroupRoot: %s", n.CgroupRoot)
	p("cgroupsPerQOS: true")
	p("enforceNodeAllocatable: [pods]")
	p("containerRuntimeEndpoint: %s", n.ContainerdEndpoint())
	p("address: %s", n.Address)
	p("port: 10250")
	p("readOnlyPort: 0")
	p("healthzBindAddress: 127.0.0.1")
	p("healthzPort: 10248")
	p("podLogsDir: %s", n.PodLogsDir())
	p("authentication:")
	p("  anonymous: {enabled: false}")
	p("  webhook: {enabled: false}")
	p("  x509: {clientCAFile: %s}", clientCAFile)
	p("authorization: {mode: AlwaysAllow}")
	if n.ClusterDNS != "" {
		p("clusterDNS: [%s]", n.ClusterDNS)
	}
	if n.ClusterDomain != "" {
		p("clusterDomain: %s", n.ClusterDomain)
	}
	p("resolvConf: /etc/resolv.conf")
	p("failSwapOn: false")
	p("serializeImagePulls: false")
	p("imageGCHighThresholdPercent: 100")
	p("imageGCLowThresholdPercent: 99")
	p("evictionHard: {}")
	p("localStorageCapacityIsolation: false")
	p("rotateCertificates: false")
	p("serverTLSBootstrap: false")
	p("registerNode: true")
	p("protectKernelDefaults: false")
	return b.String()
}

// KubeletArgs is the kubelet's command line (after the binary).
func KubeletArgs(n Node) []string {
	return []string{
		"--config", n.KubeletConfig(),
		"--kubeconfig", n.Kubeconfig,
		"--root-dir", n.KubeletDir(),
		"--cert-dir", filepath.Join(n.KubeletDir(), "pki"),
		"--hostname-override", n.Name,
		"--node-ip", n.nodeIPs(),
		"--v", "2",
	}
}

// nodeIPs is the kubelet's --node-ip: the IPv4 address, and the IPv6 one
// after it in a dual-stack lab (the first family is the Node's primary).
func (n Node) nodeIPs() string {
	if n.Address6 == "" {
		return n.Address
	}
	return n.Address + "," + n.Address6
}

// ContainerdArgs is containerd's command line (after the binary).
func ContainerdArgs(n Node) []string {
	return []string{"--config", n.ContainerdConfig()}
}
