package lab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tendril-net/tendril/pkg/bpffs"
	"github.com/tendril-net/tendril/pkg/client"
	"github.com/tendril-net/tendril/pkg/controlplane"
	"github.com/tendril-net/tendril/pkg/freeport"
	"github.com/tendril-net/tendril/pkg/lab/realnode"
	"github.com/tendril-net/tendril/pkg/lab/workload"
)

// Config says what lab to bring up.
type Config struct {
	Name        string
	Nodes       int
	PodsPerNode int
	// BinDir holds tendril, tendril-agent, tendril-cni and tendril-workload.
	BinDir string
	// AgentArgs are extra flags for every node's tendril-agent (e.g.
	// --datapath-attach-mode=tc); the lab's own flags come first, so a
	// flag given here wins.
	AgentArgs []string
	// Operators is how many tendril-operator replicas to run (0: none);
	// OperatorArgs are extra flags for each (after the lab's own).
	Operators    int
	OperatorArgs []string
	// IPAM is "" (kube-controller-manager's node CIDRs) or "cluster-pool"
	// (the operators allocate them; needs Operators > 0).
	IPAM string
	// KVStore runs an etcd for Tendril's kvstore beside the API server's:
	// the agents and operators use it for identities (kvstore identity
	// allocation) and the agents for their endpoints' ipcache keys.
	KVStore bool
	// Runtime is "" (the lab's own kubelet per node) or "containerd"
	// (RuntimeContainerd: the upstream kubelet and containerd per node,
	// Tendril installed by its Helm chart).
	Runtime string
	// ImagesDir holds the image archives of `make images` (the
	// containerd runtime imports them into every node).
	ImagesDir string
	// ChartDir is the Helm chart the containerd runtime installs
	// (default: deploy/helm/tendril of the tree the lab was built from);
	// another release's chart, to test `helm upgrade` from it.
	ChartDir string
	// BGP runs a BGP router (BIRD) in the world that every node's agent
	// peers with (bgp.go); needs Operators > 0 (LB-IPAM and the CRDs).
	BGP bool
	// RoutingMode is the agents' --routing-mode: "" or "native" (each
	// agent routes the other nodes' pod CIDRs via them on the lab
	// bridge) or "tunnel" (VXLAN between the nodes; no node has a route
	// to another's pod CIDR via the bridge).
	RoutingMode string
	// TunnelProtocol is the agents' --tunnel-protocol in tunnel mode: ""
	// (the agent's default, VXLAN), "vxlan" or "geneve" (on a kernel
	// without the Geneve module, the agents build Geneve in eBPF).
	TunnelProtocol string
	// Topology is "" or TopologyFlat (the nodes share a subnet) or
	// TopologyRouted (each node in its own subnet, the world routing
	// between them; topology.go).
	Topology string
	// Prometheus runs Debian's prometheus scraping every agent, the
	// operators and the relay (prometheus.go); the agents serve their
	// metrics and every flow metric.
	Prometheus bool
	// IPFamily is "" or IPFamilyIPv4 (an IPv4-only lab) or IPFamilyDual
	// (every node, pod and the world with an IPv6 address too, the pod
	// and service CIDRs of both families; dualstack.go).
	IPFamily string
	// Encryption is "" (none) or "wireguard": the agents encrypt pod
	// traffic between the nodes (--enable-wireguard), each node's device
	// named by WireGuardDevice.
	Encryption string
	// Out receives progress and the summary.
	Out io.Writer
}

// Labels of what `lab up` creates.
const (
	LabelLab  = "tendril.io/lab"
	LabelApp  = "app"
	LabApp    = "lab"
	PodPrefix = "pod-"
)

// CheckHost fails with a clear message when the machine cannot run a lab:
// not root, no network namespaces, no nsenter.
func CheckHost() error {
	if os.Geteuid() != 0 {
		return errors.New("the lab needs root (network namespaces, eBPF): run it with sudo")
	}
	if _, err := os.Stat("/proc/self/ns/net"); err != nil {
		return errors.New("the kernel has no network namespaces (CONFIG_NET_NS)")
	}
	if _, err := exec.LookPath("nsenter"); err != nil {
		return errors.New("nsenter not found (apt-get install util-linux)")
	}
	return nil
}

// PrepareHost is CheckHost, then what a fresh machine lacks and the lab can
// do itself: bpffs is mounted at /sys/fs/bpf when missing (out is told).
func PrepareHost(out io.Writer) error {
	if err := CheckHost(); err != nil {
		return err
	}
	mounted, err := bpffs.EnsureMounted()
	if err != nil {
		return err
	}
	if mounted {
		fmt.Fprintf(out, "==> mounted bpffs at %s (it was not mounted)\n", bpffs.DefaultMount)
	}
	return nil
}

func step(out io.Writer, start time.Time, format string, args ...any) {
	fmt.Fprintf(out, "==> %-60s %5.1fs\n", fmt.Sprintf(format, args...), time.Since(start).Seconds())
}

// Up brings a lab up and waits until every node's agent serves and every
// pod runs with an address. Leftovers of an earlier lab of the same name
// are removed first. On failure the lab is left as it is, for its logs;
// Down removes it.
func Up(ctx context.Context, cfg Config) (*State, error) {
	start := time.Now()
	out := cfg.Out
	if out == nil {
		out = io.Discard
	}
	if err := ValidateName(cfg.Name); err != nil {
		return nil, err
	}
	if cfg.Nodes < 1 || cfg.Nodes > 200 {
		return nil, fmt.Errorf("--nodes %d: must be between 1 and 200", cfg.Nodes)
	}
	if cfg.PodsPerNode < 0 {
		return nil, fmt.Errorf("--pods-per-node %d: must not be negative", cfg.PodsPerNode)
	}
	if cfg.IPAM != "" && cfg.IPAM != "cluster-pool" {
		return nil, fmt.Errorf("--ipam %q: must be cluster-pool or empty", cfg.IPAM)
	}
	if cfg.IPAM == "cluster-pool" && cfg.Operators == 0 {
		return nil, fmt.Errorf("--ipam cluster-pool needs tendril-operator: --operators 1 or more")
	}
	if err := ValidateRuntime(cfg.Runtime); err != nil {
		return nil, err
	}
	if cfg.Prometheus && cfg.Runtime == RuntimeContainerd {
		return nil, fmt.Errorf("--prometheus runs with the lab's own kubelet only, not --runtime %s", RuntimeContainerd)
	}
	if cfg.BGP && cfg.Operators == 0 {
		return nil, fmt.Errorf("--bgp needs tendril-operator (the CRDs and the load-balancer addresses): --operators 1 or more")
	}
	if cfg.RoutingMode != "" && cfg.RoutingMode != "native" && cfg.RoutingMode != "tunnel" {
		return nil, fmt.Errorf("--routing-mode %q: must be native or tunnel", cfg.RoutingMode)
	}
	if cfg.TunnelProtocol != "" && (cfg.RoutingMode != "tunnel" || (cfg.TunnelProtocol != "vxlan" && cfg.TunnelProtocol != "geneve")) {
		return nil, fmt.Errorf("--tunnel-protocol %q: must be vxlan or geneve, with --routing-mode tunnel", cfg.TunnelProtocol)
	}
	if err := ValidateTopology(cfg.Topology); err != nil {
		return nil, err
	}
	if cfg.Topology == TopologyRouted && (cfg.BGP || cfg.Runtime == RuntimeContainerd) {
		// BIRD peers with the nodes on one subnet (bgp.go), and the real
		// nodes' network is set up by package realnode for it too.
		return nil, fmt.Errorf("--topology %s: not with --bgp or --runtime %s", TopologyRouted, RuntimeContainerd)
	}
	if err := ValidateIPFamily(cfg.IPFamily); err != nil {
		return nil, err
	}
	if cfg.Encryption != "" && cfg.Encryption != "wireguard" {
		return nil, fmt.Errorf("--encryption %q: must be wireguard (or none)", cfg.Encryption)
	}
	if err := PrepareHost(out); err != nil {
		return nil, err
	}
	binaries := []string{"tendril", "tendril-agent", "tendril-cni", WorkloadBinary}
	if cfg.Runtime == RuntimeContainerd {
		binaries = append(binaries, PauseBinary)
		if _, err := imageArchives(cfg.ImagesDir); err != nil {
			return nil, err
		}
		if cfg.ChartDir != "" {
			if _, err := os.Stat(filepath.Join(cfg.ChartDir, "Chart.yaml")); err != nil {
				return nil, fmt.Errorf("--chart-dir %s: no Helm chart there: %w", cfg.ChartDir, err)
			}
		}
	} else if cfg.ChartDir != "" {
		return nil, fmt.Errorf("--chart-dir is for --runtime %s", RuntimeContainerd)
	}
	for _, b := range binaries {
		if _, err := os.Stat(filepath.Join(cfg.BinDir, b)); err != nil {
			return nil, fmt.Errorf("%s not found in %s (make build, or --bin-dir)", b, cfg.BinDir)
		}
	}
	if _, err := os.Stat(Dir(cfg.Name)); err == nil {
		fmt.Fprintf(out, "==> removing the leftovers of lab %s\n", cfg.Name)
	}
	if err := Down(cfg.Name, out); err != nil {
		return nil, fmt.Errorf("remove the leftovers of lab %s: %w", cfg.Name, err)
	}
	if missing := controlplane.MissingBinaries(controlplane.BinaryDir()); len(missing) > 0 {
		fmt.Fprintf(out, "==> building %s (hack/k8s-binaries.sh; minutes the first time)\n", strings.Join(missing, ", "))
	}
	k8sBin, err := controlplane.EnsureBinaries(out)
	if err != nil {
		return nil, err
	}
	coreDNS, err := EnsureCoreDNS(out)
	if err != nil {
		return nil, err
	}
	if cfg.Runtime == RuntimeContainerd {
		if _, err := ensureNodeBinaries(out); err != nil {
			return nil, err
		}
	}

	cgMount, err := Cgroup2Mount()
	if err != nil {
		return nil, err
	}
	st := &State{Name: cfg.Name, Dir: Dir(cfg.Name), BinDir: cfg.BinDir, K8sBinDir: k8sBin, CoreDNSBin: coreDNS,
		NetNetns: NetnsPrefix(cfg.Name) + "net", IPAM: cfg.IPAM, Runtime: cfg.Runtime, RoutingMode: cfg.RoutingMode,
		Encryption: cfg.Encryption, Topology: cfg.Topology, IPFamily: cfg.IPFamily}
	st.Kubeconfig = filepath.Join(st.Dir, "kubeconfig")
	st.NodeKubeconfig = filepath.Join(st.Dir, "kubeconfig-node")
	for _, d := range []string{st.Dir, st.PidDir(), st.LogDir(), st.PodDir(), filepath.Join(st.Dir, "pki")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	for i := 1; i <= cfg.Nodes; i++ {
		name := "node" + strconv.Itoa(i)
		nodeDir := filepath.Join(st.Dir, "nodes", name)
		addr, gw := nodeAddressing(cfg.Topology, i)
		st.Nodes = append(st.Nodes, Node{
			Name: name, Netns: NetnsPrefix(cfg.Name) + name,
			Address: addr, Gateway: gw,
			Socket:      agentSocket(cfg.Runtime, nodeDir),
			StateDir:    filepath.Join(nodeDir, "state"),
			BPFRoot:     filepath.Join(BPFDir(cfg.Name), name),
			CNICacheDir: filepath.Join(nodeDir, "cni-cache"),
			Cgroup:      NodeCgroupDir(cgMount, cfg.Name, name),
		})
		if st.Dual() {
			st.Nodes[i-1].Address6, st.Nodes[i-1].Gateway6 = nodeAddressing6(cfg.Topology, i)
		}
		if err := os.MkdirAll(nodeDir, 0o755); err != nil {
			return nil, err
		}
		if err := CreateNodeCgroup(st.Nodes[i-1].Cgroup); err != nil {
			return nil, err
		}
	}

	// Every process the lab starts is watched from here on: one that
	// exits while lab up waits on it ends the wait with its log's tail.
	exited := map[string]<-chan error{}
	cs, err := startControlPlane(ctx, st, exited)
	if err != nil {
		return st, err
	}
	step(out, start, "control plane: etcd, kube-apiserver, kube-controller-manager")
	if cfg.KVStore {
		if err := startKVStore(ctx, st, exited); err != nil {
			return st, err
		}
		step(out, start, "kvstore: etcd at %s (in each node: %s)", st.KVStoreURL(), NodeKVStoreURL())
	}

	if err := createLabNetwork(st.NetNetns); err != nil {
		return st, err
	}
	for _, n := range st.Nodes {
		if err := attachNode(st.NetNetns, n); err != nil {
			return st, err
		}
	}
	st.World = newWorld(st.Name)
	if err := createWorld(st.NetNetns, st.World); err != nil {
		return st, err
	}
	if st.Dual() {
		st.World.ServerIP6, st.World.ClientIP6 = WorldServerIP6, WorldClientIP6
		if err := addWorldIPv6(st.World, st.Nodes); err != nil {
			return st, err
		}
		for _, n := range st.Nodes {
			if err := addNodeIPv6(n); err != nil {
				return st, err
			}
		}
	}
	if cfg.Topology == TopologyRouted {
		if err := routeNodeSubnets(st.World, st.Nodes); err != nil {
			return st, err
		}
	}
	// Before the agents start: an agent's masquerade picks the device of
	// the default route.
	for _, n := range st.Nodes {
		if err := addNodeDefaultRoute(n); err != nil {
			return st, err
		}
	}
	if err := st.Save(); err != nil {
		return st, err
	}
	if cfg.Topology == TopologyRouted {
		step(out, start, "network: bridge in %s, %d node namespaces each in its own subnet (%s%s.0/%d), routed by the world (%s)",
			st.NetNetns, len(st.Nodes), routedSubnetPrefix, "N", NodeSubnetBits, st.World.Netns)
	} else {
		step(out, start, "network: bridge in %s, %d node namespaces on %s0/%d, the world (%s) behind %s",
			st.NetNetns, len(st.Nodes), NodeSubnetPrefix, NodeSubnetBits, st.World.Netns, st.World.Gateway)
	}
	if st.Dual() {
		step(out, start, "dual stack: node1 at %s, pod CIDRs of %s, services in %s", st.Nodes[0].Address6, ClusterCIDR6, ServiceCIDR6)
	}

	hubbleArgs, relayTLSArgs, err := hubblePKI(st)
	if err == nil && cfg.Prometheus {
		err = planPrometheus(st)
	}
	if err != nil {
		return st, err
	}
	if err := startWorldServer(ctx, st, exited); err != nil {
		return st, err
	}
	step(out, start, "world server: %s:%s (TCP and UDP), answering with the source it sees", st.World.ServerIP, workload.FormatPorts(WorldServerPorts))
	if cfg.Runtime == RuntimeContainerd {
		return st, upContainerd(ctx, cfg, st, cs, exited, out, start)
	}
	for i, n := range st.Nodes {
		argv := []string{filepath.Join(st.BinDir, "tendril"), "lab", "kubelet", "--name", st.Name, "--node", n.Name}
		if i == 0 {
			argv = append(argv, "--schedule")
		}
		role := "kubelet-" + n.Name
		cmd, _, err := StartDetached(st.PidDir(), role, filepath.Join(st.LogDir(), role+".log"), argv)
		if err != nil {
			return st, err
		}
		exited[role] = watchExit(cmd)
	}
	if err := waitNodesRegistered(ctx, cs, st, exited); err != nil {
		return st, err
	}
	step(out, start, "lab kubelets: %d Nodes registered, pod CIDRs assigned", len(st.Nodes))
	if err := startOperators(ctx, cfg, st, cs, exited, out, start); err != nil {
		return st, err
	}

	if cfg.BGP {
		if err := startBGPRouter(ctx, st, exited); err != nil {
			return st, err
		}
		if err := st.Save(); err != nil {
			return st, err
		}
		if err := createBGPObjects(ctx, st); err != nil {
			return st, err
		}
		step(out, start, "BGP: BIRD in %s at %s (AS %d) peering with every node (AS %d); pool %s: %s, routed", st.World.Netns,
			st.World.Gateway, BGPRouterASN, BGPNodeASN, BGPPoolName, BGPPoolCIDR)
		if st.Dual() {
			step(out, start, "BGP dual stack: IPv6 sessions to %s (BIRD's <node>_v6); pool %s: %s too", BGPRouter6(st), BGPPoolName, BGPPoolCIDR6)
		}
	}
	for i, n := range st.Nodes {
		argv := []string{"nsenter", "--net=" + NetnsPath(n.Netns), filepath.Join(st.BinDir, "tendril-agent"),
			"--node-name", n.Name, "--kubeconfig", st.NodeKubeconfig,
			"--state-dir", n.StateDir, "--socket", n.Socket, "--bpf-root", n.BPFRoot,
			"--prometheus-serve-addr", "",
			"--cgroup-root", n.Cgroup,
			// The load-balancer addresses of the lab's pool answered
			// on-link (its l2Announcements, lbpool.go).
			"--enable-l2-announcements",
			// Each node's health endpoint (a namespace with an address of
			// its pod CIDR), probed by the other nodes through the
			// datapath: `tendril health` shows pod-network reachability,
			// not only the nodes' (docs/health.md).
			"--enable-endpoint-health-checking"}
		if !st.Dual() {
			argv = append(argv, "--ipv6-range", "none")
		}
		argv = append(argv, hubbleArgs[n.Name]...)
		if cfg.Prometheus {
			argv = append(argv, agentMetricsArgs(n)...)
		}
		if cfg.BGP {
			argv = append(argv, "--enable-bgp-control-plane")
		}
		if cfg.IPAM == "cluster-pool" {
			argv = append(argv, "--ipam", "cluster-pool")
			argv = append(argv, clusterPoolArgs(st)...)
			argv = append(argv, "--k8s-service-cidr", serviceCIDRs(st))
		}
		if cfg.RoutingMode != "" {
			argv = append(argv, "--routing-mode", cfg.RoutingMode)
		}
		if cfg.TunnelProtocol != "" {
			argv = append(argv, "--tunnel-protocol", cfg.TunnelProtocol)
		}
		if cfg.Encryption == "wireguard" {
			argv = append(argv, "--enable-wireguard", "--wireguard-device", WireGuardDevice(cfg.Name, i))
		}
		if cfg.KVStore {
			argv = append(argv, "--kvstore", "etcd", "--kvstore-endpoints", NodeKVStoreURL(), "--identity-allocation-mode", "kvstore")
		}
		argv = append(argv, cfg.AgentArgs...)
		role := "agent-" + n.Name
		cmd, _, err := StartDetached(st.PidDir(), role, filepath.Join(st.LogDir(), role+".log"), argv)
		if err != nil {
			return st, err
		}
		exited[role] = watchExit(cmd)
	}
	for _, n := range st.Nodes {
		if err := waitAgent(ctx, st, n, exited["agent-"+n.Name]); err != nil {
			return st, err
		}
	}
	step(out, start, "tendril-agents: %d serving", len(st.Nodes))
	if cfg.Prometheus {
		relayTLSArgs = append(relayTLSArgs, "--prometheus-serve-addr", net.JoinHostPort(st.Nodes[0].Address, strconv.Itoa(RelayMetricsPort)))
	}
	if err := startRelay(ctx, st, relayTLSArgs, exited); err != nil {
		return st, err
	}
	step(out, start, "hubble relay: %d nodes over mTLS, unix://%s", len(st.Nodes), st.RelaySocket())
	if err := startUI(ctx, st, exited); err != nil {
		return st, err
	}
	step(out, start, "web UI: %s (tendril ui over the relay)", st.UIURL())

	for _, ns := range []string{metav1.NamespaceDefault, DNSNamespace} {
		if err := waitDefaultServiceAccount(ctx, cs, ns); err != nil {
			return st, err
		}
	}
	if err := deployClusterDNS(ctx, cs, st); err != nil {
		return st, err
	}
	total := cfg.Nodes * cfg.PodsPerNode
	for i := 1; i <= total; i++ {
		if err := createLabPod(ctx, cs, PodPrefix+strconv.Itoa(i)); err != nil {
			return st, err
		}
	}
	if total > 0 {
		if err := waitPodsReady(ctx, cs, total, out); err != nil {
			return st, err
		}
		step(out, start, "pods: %d running", total)
	}
	if err := waitClusterDNS(ctx, cs, st); err != nil {
		return st, err
	}
	step(out, start, "cluster DNS: CoreDNS on %d nodes behind %s/%s at %s", len(dnsNodes(st)), DNSNamespace, DNSServiceName, ClusterDNSIP)
	if cfg.Prometheus {
		if err := startPrometheus(ctx, st, exited); err != nil {
			return st, err
		}
		step(out, start, "prometheus: %s scraping %d targets (install/grafana has dashboards)", st.Prometheus.URL(), len(st.Prometheus.Targets))
	}
	fmt.Fprintln(out)
	if err := Summary(ctx, st, cs, out); err != nil {
		return st, err
	}
	fmt.Fprintf(out, "\nlab %s is up in %.1fs: tendril lab env prints how to reach it; tendril lab down removes it\n", st.Name, time.Since(start).Seconds())
	return st, nil
}

// watchExit reports a started process' exit (while this process lives).
func watchExit(cmd *exec.Cmd) <-chan error {
	ch := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		if err == nil {
			err = errors.New("exited with status 0")
		}
		ch <- err
	}()
	return ch
}

// logTail is the end of a log, for error messages.
func logTail(path string, lines int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	var all []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		all = append(all, sc.Text())
	}
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

func exitedError(st *State, role string, err error) error {
	log := filepath.Join(st.LogDir(), role+".log")
	return fmt.Errorf("%s %v; end of %s:\n%s", role, err, log, logTail(log, 20))
}

func startControlPlane(ctx context.Context, st *State, exited map[string]<-chan error) (kubernetes.Interface, error) {
	// The API server advertises node1's lab address: every lab kubelet
	// forwards <its node address>:<API port> to it, so pods reach the
	// kubernetes Service's endpoint through node1.
	spec := controlplane.Spec{Dir: st.Dir, ControllerManager: true, ClusterCIDR: ClusterCIDR, AdvertiseAddress: st.Nodes[0].Address}
	if st.Dual() {
		// Node IPAM gives each Node a pod CIDR of each family; a
		// PreferDualStack Service gets a ClusterIP of each.
		spec.ClusterCIDR += "," + ClusterCIDR6
		spec.NodeCIDRMaskSizeIPv6 = podCIDR6Bits
		spec.ServiceCIDR = serviceCIDRs(st)
	}
	if st.Runtime == RuntimeContainerd {
		spec.ExtraControllers = realNodeControllers()
	}
	var nodeIPs []net.IP
	for _, n := range st.Nodes {
		nodeIPs = append(nodeIPs, net.ParseIP(n.Address))
	}
	var err error
	if spec.PKI, err = controlplane.NewPKI(filepath.Join(st.Dir, "pki"), net.ParseIP(controlplane.KubernetesSvcIP), 365*24*time.Hour, nodeIPs...); err != nil {
		return nil, err
	}
	if err := spec.AllocatePorts(); err != nil {
		return nil, err
	}
	st.APIPort = spec.APIPort
	if err := spec.WriteKubeconfig(st.Kubeconfig, spec.APIServerURL(), "tendril-lab-"+st.Name); err != nil {
		return nil, err
	}
	nodeURL := "https://127.0.0.1:" + strconv.Itoa(NodeAPIPort)
	if err := spec.WriteKubeconfig(st.NodeKubeconfig, nodeURL, "tendril-lab-"+st.Name); err != nil {
		return nil, err
	}
	if err := writeCoreDNSConfig(st, &spec); err != nil {
		return nil, err
	}
	if err := st.Save(); err != nil {
		return nil, err
	}
	rc, err := controlplane.RESTConfig(st.Kubeconfig)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	run := func(role, bin string, args []string) (<-chan error, error) {
		cmd, _, err := StartDetached(st.PidDir(), role, filepath.Join(st.LogDir(), role+".log"),
			append([]string{filepath.Join(st.K8sBinDir, bin)}, args...))
		if err != nil {
			return nil, err
		}
		exited[role] = watchExit(cmd)
		return exited[role], nil
	}
	etcdExit, err := run("etcd", controlplane.EtcdBinary, spec.EtcdArgs())
	if err != nil {
		return nil, err
	}
	if err := controlplane.WaitTCP(ctx, "127.0.0.1:"+strconv.Itoa(spec.EtcdPort), 30*time.Second); err != nil {
		select {
		case e := <-etcdExit:
			return nil, exitedError(st, "etcd", e)
		default:
		}
		return nil, fmt.Errorf("etcd: %w", err)
	}
	apiExit, err := run("kube-apiserver", controlplane.APIServerBinary, spec.APIServerArgs())
	if err != nil {
		return nil, err
	}
	err = controlplane.WaitReady(ctx, cs, 90*time.Second, func() error {
		select {
		case e := <-apiExit:
			return exitedError(st, "kube-apiserver", e)
		default:
			return nil
		}
	})
	if err != nil {
		return nil, err
	}
	if _, err := run("kube-controller-manager", controlplane.ControllerManagerBinary, spec.ControllerManagerArgs(st.Kubeconfig)); err != nil {
		return nil, err
	}
	return cs, nil
}

// startKVStore runs the lab's kvstore: a second etcd, apart from the API
// server's, on free ports of the machine's loopback. The kubelets
// (started after it) proxy it into the node namespaces.
func startKVStore(ctx context.Context, st *State, exited map[string]<-chan error) error {
	client, err := freeport.Loopback()
	if err != nil {
		return err
	}
	peerPort, err := freeport.Loopback(client)
	if err != nil {
		return err
	}
	st.KVStorePort = client
	peer := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	argv := []string{filepath.Join(st.K8sBinDir, controlplane.EtcdBinary), "--name", "kvstore",
		"--data-dir", filepath.Join(st.Dir, "kvstore"),
		"--listen-client-urls", st.KVStoreURL(), "--advertise-client-urls", st.KVStoreURL(),
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "kvstore=" + peer, "--log-level", "warn"}
	cmd, _, err := StartDetached(st.PidDir(), "kvstore", filepath.Join(st.LogDir(), "kvstore.log"), argv)
	if err != nil {
		return err
	}
	exited["kvstore"] = watchExit(cmd)
	if err := controlplane.WaitTCP(ctx, "127.0.0.1:"+strconv.Itoa(client), 30*time.Second); err != nil {
		select {
		case e := <-exited["kvstore"]:
			return exitedError(st, "kvstore", e)
		default:
		}
		return fmt.Errorf("kvstore etcd: %w", err)
	}
	return st.Save()
}

// poll calls cond every interval until it is done, fails, a watched
// process exits or timeout passes; what names the wait in errors. A
// *stopPolling error from cond ends the wait at once (a failure that
// waiting will not cure).
func poll(ctx context.Context, what string, timeout time.Duration, st *State, exited map[string]<-chan error, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		var stop *stopPolling
		if errors.As(err, &stop) {
			return fmt.Errorf("%s: %w", what, stop.err)
		}
		if err != nil {
			last = err
		}
		for role, ch := range exited {
			select {
			case e := <-ch:
				return exitedError(st, role, e)
			default:
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not done after %s (last: %v)", what, timeout, last)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", what, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// stopPolling is a cond error that ends poll at once.
type stopPolling struct{ err error }

func (s *stopPolling) Error() string { return s.err.Error() }
func (s *stopPolling) Unwrap() error { return s.err }

func waitNodesRegistered(ctx context.Context, cs kubernetes.Interface, st *State, exited map[string]<-chan error) error {
	return poll(ctx, "wait for the Nodes and their pod CIDRs", 60*time.Second, st, exited, func() (bool, error) {
		for _, n := range st.Nodes {
			obj, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			if len(obj.Spec.PodCIDRs) == 0 {
				return false, fmt.Errorf("node %s has no pod CIDR yet", n.Name)
			}
		}
		return true, nil
	})
}

// agentSocket is where, seen from the machine, node nodeDir's agent
// serves its API: the lab's own agent's socket, or on a real node
// (containerd) the chart's agent's default socket in the node's
// /var/run/tendril, which is bound from a directory of the lab's.
func agentSocket(runtime, nodeDir string) string {
	if runtime == RuntimeContainerd {
		return filepath.Join(realnode.Node{Dir: nodeDir}.TendrilRunDir(), filepath.Base(client.DefaultSocket))
	}
	return filepath.Join(nodeDir, "agent.sock")
}

func waitAgent(ctx context.Context, st *State, n Node, exited <-chan error) error {
	c, err := client.New(n.Socket)
	if err != nil {
		return err
	}
	return poll(ctx, "wait for the agent of "+n.Name, 3*time.Minute, st, map[string]<-chan error{"agent-" + n.Name: exited}, func() (bool, error) {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := c.ConfigGet(cctx)
		return err == nil, err
	})
}

// waitDefaultServiceAccount waits for the controller manager to make the
// namespace's default ServiceAccount: the ServiceAccount admission plugin
// rejects pods until it exists.
func waitDefaultServiceAccount(ctx context.Context, cs kubernetes.Interface, namespace string) error {
	return poll(ctx, "wait for the default ServiceAccount of "+namespace, 60*time.Second, nil, nil, func() (bool, error) {
		_, err := cs.CoreV1().ServiceAccounts(namespace).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, err
	})
}

func createLabPod(ctx context.Context, cs kubernetes.Interface, name string) error {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault, Labels: map[string]string{LabelApp: LabApp}},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "workload", Image: "tendril.io/lab-workload"}},
		},
	}
	_, err := cs.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create pod %s: %w", name, err)
	}
	return nil
}

// PodReady reports a pod running, Ready and with an address.
func PodReady(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func waitPodsReady(ctx context.Context, cs kubernetes.Interface, total int, out io.Writer) error {
	reported := -1
	return poll(ctx, "wait for the lab's pods", 3*time.Minute, nil, nil, func() (bool, error) {
		pods, err := cs.CoreV1().Pods(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{LabelSelector: LabelApp + "=" + LabApp})
		if err != nil {
			return false, err
		}
		ready := 0
		for i := range pods.Items {
			if PodReady(&pods.Items[i]) {
				ready++
			}
		}
		if ready != reported && ready < total {
			fmt.Fprintf(out, "    pods ready: %d/%d\n", ready, total)
			reported = ready
		}
		return ready >= total, fmt.Errorf("%d/%d pods ready", ready, total)
	})
}

// WireGuardDevice is the WireGuard device of the lab's node i (from 0).
// The userspace device's control socket, /var/run/wireguard/<name>.sock,
// is the machine's, shared by every lab node and lab: each needs a name
// of its own, within Linux's 15 characters.
func WireGuardDevice(lab string, i int) string {
	name := fmt.Sprintf("wg%d-%s", i+1, lab)
	if len(name) > 15 {
		name = name[:15]
	}
	return name
}
