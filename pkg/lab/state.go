// Package lab runs Tendril's local lab on one Linux machine: a Kubernetes
// control plane (etcd, kube-apiserver, kube-controller-manager), nodes as
// network namespaces on a bridge, and per node a tendril-agent and a lab
// kubelet (package lab/kubelet) whose pods are network namespaces wired by
// tendril-cni. Every process is started detached and recorded under the
// lab's directory, so `tendril lab down` (and the next `lab up`, after a
// crash) can remove everything the lab made.
package lab

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// DefaultName is the lab's name unless told otherwise; it prefixes the
// lab's network namespaces.
const DefaultName = "tdrlab"

// Roots under which each lab keeps its directory and its nodes' pinned
// BPF objects, one subdirectory per lab name.
const (
	RunRoot = "/var/run/tendril-lab"
	BPFRoot = "/sys/fs/bpf/tendril-lab"
)

// Lab network: node N gets NodeSubnetBase+10+N on the lab bridge.
const (
	NodeSubnetPrefix = "172.30.0."
	NodeSubnetBits   = 24
	ClusterCIDR      = "10.244.0.0/16"
	// NodeAPIPort is where, inside each node's namespace, the lab kubelet
	// proxies the API server (which listens on the machine's loopback).
	NodeAPIPort = 6443
	// NodeKVStorePort is where, inside each node's namespace, the lab
	// kubelet proxies the lab's kvstore etcd (lab up --kvstore).
	NodeKVStorePort = 2379
	// BridgeName is the bridge in the lab network namespace.
	BridgeName = "labbr0"
)

var validName = regexp.MustCompile(`^[a-z][a-z0-9]{0,11}$`)

// ValidateName checks a lab name: it becomes part of namespace and
// directory names, and a dash in it could make one lab's prefix match
// another's.
func ValidateName(name string) error {
	if !validName.MatchString(name) {
		return fmt.Errorf("lab name %q: must be 1-12 lowercase letters and digits, starting with a letter", name)
	}
	return nil
}

// Dir is the lab's directory.
func Dir(name string) string { return filepath.Join(RunRoot, name) }

// CmdlineNamesDir reports whether a process's command line (as read from
// /proc/PID/cmdline: arguments separated by NUL bytes) names dir or a path
// under it. A plain substring test would not do: lab "tdre2e"'s directory is
// a prefix of lab "tdre2ecd"'s, and the two run side by side in CI.
func CmdlineNamesDir(cmdline []byte, dir string) bool {
	dir = filepath.Clean(dir)
	for arg := range bytes.SplitSeq(cmdline, []byte{0}) {
		for i := bytes.Index(arg, []byte(dir)); i >= 0; {
			end := i + len(dir)
			if end == len(arg) || arg[end] == '/' {
				return true
			}
			next := bytes.Index(arg[end:], []byte(dir))
			if next < 0 {
				break
			}
			i = end + next
		}
	}
	return false
}

// BPFDir holds the pinned BPF objects of every node of the lab.
func BPFDir(name string) string { return filepath.Join(BPFRoot, name) }

// NetnsPrefix starts the name of every network namespace of the lab.
func NetnsPrefix(name string) string { return name + "-" }

// NetnsPath is where a named network namespace is mounted.
func NetnsPath(netnsName string) string { return filepath.Join("/run/netns", netnsName) }

// Node is one lab node.
type Node struct {
	Name string `json:"name"`
	// Netns is the node's network namespace; the agent runs inside it.
	Netns string `json:"netns"`
	// Address is the node's InternalIP on the lab bridge.
	Address string `json:"address"`
	// Gateway is the node's default gateway, the world's address in the
	// node's subnet ("" in a lab made before topologies: WorldGateway).
	Gateway string `json:"gateway,omitempty"`
	// Address6 and Gateway6 are the node's IPv6 address and gateway in a
	// dual-stack lab (IPFamilyDual; empty otherwise).
	Address6 string `json:"address6,omitempty"`
	Gateway6 string `json:"gateway6,omitempty"`
	// Socket is the agent's API socket.
	Socket string `json:"socket"`
	// StateDir is the agent's state directory.
	StateDir string `json:"stateDir"`
	// BPFRoot is the agent's bpffs directory.
	BPFRoot string `json:"bpfRoot"`
	// CNICacheDir is where the kubelet's libcni keeps ADD results for DEL.
	CNICacheDir string `json:"cniCacheDir"`
	// Cgroup is the node's cgroup v2 (<cgroup2>/tendril-lab/<lab>/<node>):
	// the agent attaches socket load-balancing there (--cgroup-root) and
	// the node's pod workloads, probes and exec'd commands run inside it.
	Cgroup string `json:"cgroup"`
}

// State is what `lab up` decided, written to lab.json for the other lab
// commands and the kubelets.
type State struct {
	Name string `json:"name"`
	Dir  string `json:"dir"`
	// BinDir holds tendril, tendril-agent and tendril-cni.
	BinDir string `json:"binDir"`
	// K8sBinDir holds the control plane binaries (and kubectl if built).
	K8sBinDir string `json:"k8sBinDir"`
	// CoreDNSBin is the CoreDNS binary the kubelets run for the cluster
	// DNS pods (hack/coredns.sh builds it).
	CoreDNSBin string `json:"coreDNSBin,omitempty"`
	// APIPort is the API server's port on the machine's 127.0.0.1.
	APIPort int `json:"apiPort"`
	// Kubeconfig reaches the API server from the machine's namespace.
	Kubeconfig string `json:"kubeconfig"`
	// NodeKubeconfig reaches it from inside a node namespace, through the
	// kubelet's proxy on 127.0.0.1:NodeAPIPort.
	NodeKubeconfig string `json:"nodeKubeconfig"`
	// NetNetns holds the lab bridge.
	NetNetns string `json:"netNetns"`
	Nodes    []Node `json:"nodes"`
	// IPAM is how the nodes got their pod CIDRs: "" (Node.spec.podCIDRs,
	// from kube-controller-manager) or "cluster-pool" (the operators'
	// TendrilNode.spec.ipam.podCIDRs).
	IPAM string `json:"ipam,omitempty"`
	// RoutingMode is the agents' --routing-mode ("": native).
	RoutingMode string `json:"routingMode,omitempty"`
	// Topology is the nodes' addressing: "" (TopologyFlat) or
	// TopologyRouted (network.go).
	Topology string `json:"topology,omitempty"`
	// IPFamily is "" or IPFamilyIPv4 (the lab is IPv4 only) or
	// IPFamilyDual (dualstack.go).
	IPFamily string `json:"ipFamily,omitempty"`
	// Encryption is "" or "wireguard" (the agents' --enable-wireguard).
	Encryption string `json:"encryption,omitempty"`
	// KVStorePort is the port of the lab's kvstore etcd on the machine's
	// 127.0.0.1 (0: no kvstore); the kubelets proxy it into each node's
	// namespace at 127.0.0.1:NodeKVStorePort.
	KVStorePort int `json:"kvstorePort,omitempty"`
	// Runtime is "" (the lab's own kubelets) or "containerd" (real nodes:
	// the upstream kubelet and containerd, package realnode).
	Runtime string `json:"runtime,omitempty"`
	// WorkloadImage is, on real nodes, the workload image imported into
	// every node's containerd (localhost/tendril/workload:<tag>): the
	// image of the connectivity test's pods. Empty for the lab kubelet.
	WorkloadImage string `json:"workloadImage,omitempty"`
	// World is the network outside the cluster (world.go); nil in the
	// state of a lab made before it existed.
	World *World `json:"world,omitempty"`
	// BGP is the lab's BGP router (lab up --bgp; bgp.go); nil without.
	BGP *BGPRouter `json:"bgp,omitempty"`
	// UIPort is the port of the lab's web UI (tendril ui, ui.go) on the
	// machine's 127.0.0.1; 0: none.
	UIPort int `json:"uiPort,omitempty"`
	// Prometheus is the lab's Prometheus (lab up --prometheus,
	// prometheus.go); nil without.
	Prometheus *Prometheus `json:"prometheus,omitempty"`
}

// KVStoreURL is the kvstore's client URL from the machine's namespace
// ("" without a kvstore).
func (s *State) KVStoreURL() string {
	if s.KVStorePort == 0 {
		return ""
	}
	return "http://127.0.0.1:" + strconv.Itoa(s.KVStorePort)
}

// NodeKVStoreURL is the kvstore's client URL from inside a node's
// namespace, through the kubelet's proxy.
func NodeKVStoreURL() string { return "http://127.0.0.1:" + strconv.Itoa(NodeKVStorePort) }

func (s *State) path() string { return filepath.Join(s.Dir, "lab.json") }

// PidDir holds one pid file per detached process.
func (s *State) PidDir() string { return filepath.Join(s.Dir, "pids") }

// LogDir holds the processes' logs.
func (s *State) LogDir() string { return filepath.Join(s.Dir, "logs") }

// CAFile is the lab's certificate authority (it signed the API server's
// serving certificate).
func (s *State) CAFile() string { return filepath.Join(s.Dir, "pki", "ca.crt") }

// PodDir holds a record per running pod.
func (s *State) PodDir() string { return filepath.Join(s.Dir, "pods") }

// Node returns the node called name.
func (s *State) Node(name string) (*Node, error) {
	for i := range s.Nodes {
		if s.Nodes[i].Name == name {
			return &s.Nodes[i], nil
		}
	}
	return nil, fmt.Errorf("lab %s has no node %q", s.Name, name)
}

// Save writes lab.json atomically.
func (s *State) Save() error {
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(s.path(), data)
}

// ErrNotRunning says there is no lab of that name.
var ErrNotRunning = errors.New("no lab is up")

// LoadState reads lab.json of the named lab.
func LoadState(name string) (*State, error) {
	data, err := os.ReadFile(filepath.Join(Dir(name), "lab.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("lab %s: %w (tendril lab up)", name, ErrNotRunning)
	}
	if err != nil {
		return nil, fmt.Errorf("read lab state: %w", err)
	}
	s := &State{}
	if err := json.Unmarshal(data, s); err != nil {
		return nil, fmt.Errorf("lab state %s: %w", filepath.Join(Dir(name), "lab.json"), err)
	}
	return s, nil
}

// PodRecord is a pod the kubelet runs: how `lab exec` and `lab probe` find
// its network namespace.
type PodRecord struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
	Node      string `json:"node"`
	Netns     string `json:"netns"`
	// NetnsPath is the network namespace as a path, for a pod of a real
	// node (/proc/<sandbox pid>/ns/net); empty for the lab kubelet's,
	// whose Netns is a name under /run/netns.
	NetnsPath   string   `json:"netnsPath,omitempty"`
	ContainerID string   `json:"containerID"`
	IPs         []string `json:"ips"`
	// ResolvConf is the pod's resolv.conf, which `lab exec` mounts over
	// /etc/resolv.conf in a mount namespace of its own; "" for a pod that
	// uses the machine's (dnsPolicy Default, as CoreDNS's own pods).
	ResolvConf string `json:"resolvConf,omitempty"`
	// Cgroup is the cgroup the pod's container runs in (PodCgroupDir,
	// under its node's); "" for a pod of a lab made before pods had
	// cgroups of their own, or of a real node.
	Cgroup string `json:"cgroup,omitempty"`
}

// NetnsFile is the path of the pod's network namespace.
func (r *PodRecord) NetnsFile() string {
	if r.NetnsPath != "" {
		return r.NetnsPath
	}
	return NetnsPath(r.Netns)
}

func (s *State) podRecordPath(namespace, name string) string {
	return filepath.Join(s.PodDir(), namespace+"_"+name+".json")
}

// WritePod records a running pod.
func (s *State) WritePod(r PodRecord) error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return writeFileAtomic(s.podRecordPath(r.Namespace, r.Name), data)
}

// PodResolvConfPath is where the kubelet writes a pod's resolv.conf.
func (s *State) PodResolvConfPath(namespace, name string) string {
	return filepath.Join(s.PodDir(), namespace+"_"+name+".resolv.conf")
}

// RemovePod drops the record of the pod with that UID; a record of a newer
// pod of the same name stays.
func (s *State) RemovePod(namespace, name, uid string) error {
	r, err := s.Pod(namespace, name)
	if err != nil || r.UID != uid {
		return nil
	}
	if err := os.Remove(s.podRecordPath(namespace, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := os.Remove(s.PodResolvConfPath(namespace, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// ErrNoPod says the lab runs no pod of that name.
var ErrNoPod = errors.New("no such pod running in the lab")

// Pod reads the record of a running pod; on real nodes (Runtime
// containerd) it asks the API server and the pod's node (cripod.go).
func (s *State) Pod(namespace, name string) (*PodRecord, error) {
	if s.Runtime == RuntimeContainerd {
		return s.criPod(namespace, name)
	}
	data, err := os.ReadFile(s.podRecordPath(namespace, name))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s/%s: %w", namespace, name, ErrNoPod)
	}
	if err != nil {
		return nil, err
	}
	r := &PodRecord{}
	if err := json.Unmarshal(data, r); err != nil {
		return nil, fmt.Errorf("pod record %s/%s: %w", namespace, name, err)
	}
	return r, nil
}

// ParsePodRef splits NS/POD (a bare POD means namespace default).
func ParsePodRef(ref string) (namespace, name string, err error) {
	ns, pod, ok := strings.Cut(ref, "/")
	if !ok {
		ns, pod = "default", ref
	}
	if ns == "" || pod == "" || strings.Contains(pod, "/") {
		return "", "", fmt.Errorf("pod %q: want NAMESPACE/POD", ref)
	}
	return ns, pod, nil
}

// writeFileAtomic replaces path with data; readers see the old or the new
// content, never a part, and concurrent writers never share a temp file.
func writeFileAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	_, werr := f.Write(data)
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// PodCgroup is the cgroup of the pod's container, or of the node that runs
// the pod for a pod without one ("" for a lab made before nodes had
// cgroups).
func (s *State) PodCgroup(rec *PodRecord) (string, error) {
	if rec.Cgroup != "" {
		return rec.Cgroup, nil
	}
	n, err := s.Node(rec.Node)
	if err != nil {
		return "", fmt.Errorf("pod %s/%s: %w", rec.Namespace, rec.Name, err)
	}
	return n.Cgroup, nil
}

// EnterPodCgroup moves the calling process into the cgroup of the pod's
// container (below its node's), as `kubectl exec` joins the container's
// cgroup: its connections (and those of what it execs) go through that
// node's socket load-balancing as the pod's own would, and their flows
// name the pod.
func (s *State) EnterPodCgroup(rec *PodRecord) error {
	cg, err := s.PodCgroup(rec)
	if err != nil || cg == "" {
		return err
	}
	return EnterCgroup(cg)
}
