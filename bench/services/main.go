// Command services compares Tendril's service load-balancing with
// kube-proxy v1.36.3 in iptables and nftables mode in one run, on real
// network namespaces and a real kube-apiserver + etcd (pkg/testutil/k8senv).
//
// Topology, built fresh for every (size, mode): a node namespace (the proxy
// runs there: tendril-agent with its socket LB on a cgroup of the
// benchmark's own, or kube-proxy, which never touches the machine's root
// namespace), a client pod namespace and a backend pod namespace, each wired
// to the node by a veth; the node routes between them. The backend pod holds
// 11 addresses; one listener per port answers on all of them, so the
// services' 10 backends each are few real listeners behind many Service
// objects. The benchmark process itself runs in that cgroup: the sockets it
// opens in the client namespace are the client pod's.
//
// Per size it measures TCP connect latency to random ClusterIPs (p50, p99),
// the time from start until every service answers, agent / kube-proxy RSS;
// at the programming size also one changed service realized (EndpointSlice
// update until a connection reaches the new backend), the proxies' sync
// metrics, and iperf3 throughput client pod -> ClusterIP -> backend pod
// against client pod -> backend pod. It prints Markdown.
package main

import (
	"bufio"
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/tendril-net/tendril/bench/internal/procmem"
	"github.com/tendril-net/tendril/pkg/controlplane"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/namedns"
	"github.com/tendril-net/tendril/pkg/testutil/k8senv"
)

const (
	benchNS  = "bench"
	nodeName = "tdrkp-node"
	nodeNS   = "tdrkp-n"
	clientNS = "tdrkp-c"
	backNS   = "tdrkp-b"
	nodeIP   = "10.244.1.1"
	clientIP = "10.244.1.2"
	// backendBase..+9 are every service's backends; changedIP answers on
	// changedPort only (the one-change test moves a service there).
	backendBase = "10.244.2.1"
	changedIP   = "10.244.2.11"
	svcPort     = 80
	backendPort = 8080
	changedPort = 8081
	iperfPort   = 5201
	cgroupRoot  = "/sys/fs/cgroup/unified"
)

type config struct {
	sizes       []int
	modes       []string
	programSize int
	// changesAt are more sizes at which one change is measured (without
	// throughput).
	changesAt map[int]bool
	connects  int
	changes   int
	iperfTime int
	agentBin  string
	// baselineAgent is another agent binary, run as mode
	// "tendril-baseline" (an old build against the new in one run).
	baselineAgent string
	kubeProxy     string
	workers       int
	readyLimit    time.Duration
	// directAbove: Services past this count are written into etcd
	// (direct.go says why); 0: every Service through the API server.
	directAbove int
	// heapDir receives a heap profile of the agent at each point
	// (empty: none; the agent then serves no pprof).
	heapDir string
	// settle is a pause before the memory reading, so that what the
	// runtime returns to the kernel after the work is not counted.
	settle time.Duration
}

func main() {
	var sizes, modes string
	var c config
	flag.StringVar(&sizes, "sizes", "100,1000,10000,25000", "service counts (10 backends each), ascending")
	flag.StringVar(&modes, "modes", "tendril,iptables,nftables", "proxies to compare")
	flag.IntVar(&c.programSize, "program-size", 10000, "size at which programming, one-change and throughput are measured")
	var changesAt string
	flag.StringVar(&changesAt, "changes-at", "", "more sizes (comma-separated) at which one change is measured")
	flag.IntVar(&c.connects, "connects", 2000, "connections per latency point")
	flag.IntVar(&c.changes, "changes", 50, "one-service changes at the programming size")
	flag.IntVar(&c.iperfTime, "iperf-seconds", 4, "seconds per iperf3 run (two runs each way, alternating)")
	flag.StringVar(&c.agentBin, "agent", "bin/tendril-agent", "tendril-agent binary")
	flag.StringVar(&c.baselineAgent, "agent-baseline", "", "another tendril-agent binary, run as mode tendril-baseline")
	flag.StringVar(&c.kubeProxy, "kube-proxy", "", "kube-proxy binary (hack/kube-proxy.sh)")
	flag.IntVar(&c.workers, "workers", 32, "concurrent creates while filling the API server")
	flag.IntVar(&c.directAbove, "direct-above", 0, "write Services past this count into the API server's etcd instead of creating them (kube-apiserver's ClusterIP allocation is O(Services) per create); 0: never")
	flag.StringVar(&c.heapDir, "heap-profiles", "", "directory for a heap profile of the agent at each point (the agent serves pprof in the node namespace)")
	flag.DurationVar(&c.settle, "settle", 0, "pause before each point's memory reading (RSS, RssAnon, RssFile, VmHWM)")
	flag.DurationVar(&c.readyLimit, "ready-limit", 5*time.Minute, "how long a proxy may take until every service answers")
	flag.Parse()
	// A missing directory would lose every profile of a run an hour long.
	if c.heapDir != "" {
		if err := os.MkdirAll(c.heapDir, 0o755); err != nil {
			log.Fatal(err)
		}
	}
	for _, s := range strings.Split(sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			log.Fatalf("-sizes: bad size %q", s)
		}
		c.sizes = append(c.sizes, n)
	}
	c.changesAt = map[int]bool{}
	for _, s := range strings.Split(changesAt, ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(s)); err == nil {
			c.changesAt[n] = true
		}
	}
	c.modes = strings.Split(modes, ",")
	for _, m := range c.modes {
		if m != "tendril" && m != "tendril-baseline" && m != "iptables" && m != "iptables-legacy" && m != "nftables" {
			log.Fatalf("-modes: unknown mode %q (tendril, tendril-baseline, iptables, iptables-legacy, nftables)", m)
		}
		if m == "tendril-baseline" && c.baselineAgent == "" {
			log.Fatal("-modes tendril-baseline needs -agent-baseline")
		}
	}
	if slices.ContainsFunc(c.modes, func(m string) bool { return !isTendril(m) }) {
		if c.kubeProxy == "" {
			log.Fatal("-kube-proxy is required for the iptables and nftables modes")
		}
	}
	if err := run(c); err != nil {
		log.Fatal(err)
	}
}

// isTendril says mode runs the agent.
func isTendril(mode string) bool { return mode == "tendril" || mode == "tendril-baseline" }

// result is one (size, mode) point.
type result struct {
	size     int
	mode     string
	p50, p99 time.Duration
	// floorP50 and floorP99: connect from the client pod straight to the
	// backend pod's address (no service), interleaved with the service
	// connects: what connect costs on this machine at that moment.
	floorP50, floorP99 time.Duration
	// hookNs is the connect4 hook's mean run time per call during the
	// connects (kernel BPF statistics; tendril only).
	hookNs     float64
	failed     int
	ready      time.Duration // start until every service answered
	syncToMaps time.Duration // tendril: caches synced until the maps hold every frontend
	rssMiB     float64
	// mem is the agent's (or kube-proxy's) /proc status memory lines at
	// the reading; heap the runtime's account of the agent's memory after
	// a forced GC, its live heap among it (zero: not read, -heap-profiles
	// unset).
	mem                 procmem.Mem
	heap                procmem.Heap
	changeP50, change99 time.Duration
	changeN             int
	// watchP50/P99: when a plain watch saw the same changes.
	watchP50, watchP99 time.Duration
	metrics            string
	svcGbps, podGbps   float64
	err                string // the point failed
}

// cleanLeftovers removes what a killed earlier run left: its namespaces,
// empty bench cgroups and agent pin directories.
func cleanLeftovers() {
	deleteNamespaces()
	old, _ := filepath.Glob(filepath.Join(cgroupRoot, "tdrkp-*"))
	for _, d := range old {
		_ = os.Remove(d) // fails while a process is inside: kept
	}
	pins, _ := filepath.Glob("/sys/fs/bpf/tdrkp-*")
	for _, d := range pins {
		_ = os.RemoveAll(d)
	}
}

func run(c config) error {
	ctx := context.Background()
	cleanLeftovers()
	cg, err := os.MkdirTemp(cgroupRoot, "tdrkp-")
	if err != nil {
		return fmt.Errorf("bench cgroup: %w", err)
	}
	defer os.Remove(cg)
	// The whole benchmark runs in its cgroup: the sockets it opens in the
	// client namespace are the client pod's for the socket LB.
	parent, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(cg, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
		return fmt.Errorf("enter the bench cgroup: %w", err)
	}
	defer restoreCgroup(parent)

	// A /16 holds 65,534 services: larger runs get a /12 (the API
	// server's limit for the service range).
	opts := k8senv.Options{}
	if c.sizes[len(c.sizes)-1] > 60000 {
		opts.ServiceCIDR = "10.96.0.0/12"
	}
	serviceRange := netip.MustParsePrefix(cmp.Or(opts.ServiceCIDR, controlplane.ServiceCIDR))
	env, err := k8senv.Start(ctx, opts)
	if err != nil {
		return fmt.Errorf("control plane: %w", err)
	}
	defer env.Stop()
	rc := env.RESTConfig()
	rc.QPS, rc.Burst = 5000, 5000
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	apiAddr := strings.TrimPrefix(rc.Host, "https://")
	if err := setupCluster(ctx, cs); err != nil {
		return err
	}
	b := &bench{c: c, cs: cs, kubeconfig: env.Kubeconfig(), apiAddr: apiAddr, cgroup: cg, etcdURL: env.EtcdURL(), serviceRange: serviceRange}
	fmt.Printf("# services benchmark %s, load %s\n", time.Now().UTC().Format("2006-01-02 15:04 MST"), loadavg())
	var results []result
	gaveUp := map[string]bool{}
	for _, size := range c.sizes {
		t0 := time.Now()
		if err := b.fill(ctx, size); err != nil {
			return err
		}
		log.Printf("API server holds %d services (filled in %s)", size, time.Since(t0).Round(time.Millisecond))
		for _, mode := range c.modes {
			if gaveUp[mode] {
				results = append(results, result{size: size, mode: mode, err: "not run: failed at a smaller size"})
				continue
			}
			r, err := b.point(ctx, size, mode)
			if err != nil {
				// Recorded, and the mode is not tried at larger sizes.
				log.Printf("%s at %d services: %v", mode, size, err)
				msg := err.Error()
				if i := strings.IndexByte(msg, '\n'); i > 0 {
					msg = msg[:i]
				}
				results = append(results, result{size: size, mode: mode, err: msg})
				gaveUp[mode] = true
				continue
			}
			log.Printf("%s %d: p50 %s p99 %s ready %s rss %.0f MiB (%s) heap: %s", mode, size, r.p50, r.p99, r.ready, r.rssMiB, r.mem, r.heap)
			results = append(results, r)
		}
	}
	report(results, c)
	return nil
}

func restoreCgroup(procSelfCgroup []byte) {
	for _, l := range strings.Split(string(procSelfCgroup), "\n") {
		if rest, ok := strings.CutPrefix(l, "0::"); ok {
			_ = os.WriteFile(filepath.Join(cgroupRoot, rest, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0)
		}
	}
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

type bench struct {
	c          config
	cs         kubernetes.Interface
	kubeconfig string
	apiAddr    string
	cgroup     string
	etcdURL    string
	// serviceRange is the API server's service range (the direct fill
	// picks its ClusterIPs from it).
	serviceRange netip.Prefix
	services     []netip.Addr // ClusterIPs of bench services 0..n-1
	iperfIP      netip.Addr
	// changedSvcs are the services the one-change test moved (restored
	// before the next mode).
	changedSvcs []int
}

// setupCluster creates the namespace, this node and the iperf3 service.
func setupCluster(ctx context.Context, cs kubernetes.Interface) error {
	var err error
	for i := 0; i < 50; i++ { // the API server may still settle after /readyz
		if _, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: benchNS}}, metav1.CreateOptions{}); err == nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("create namespace: %w", err)
	}
	n, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName},
		Spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24"}, PodCIDR: "10.244.1.0/24"}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create node: %w", err)
	}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: nodeIP}, {Type: corev1.NodeHostName, Address: nodeName}}
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("node status: %w", err)
	}
	return nil
}

func service(name string, port, target int32) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: benchNS},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "p", Port: port, TargetPort: intstr.FromInt32(target), Protocol: corev1.ProtocolTCP}}}}
}

func slice(svc string, addrs []string, port int32) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: svc + "-1", Namespace: benchNS, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("p"), Port: ptr(port), Protocol: ptr(corev1.ProtocolTCP)}},
	}
	for _, a := range addrs {
		node := nodeName
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}, NodeName: &node,
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)}})
	}
	return es
}

func ptr[T any](v T) *T { return &v }

func backendAddrs() []string {
	base := netip.MustParseAddr(backendBase)
	var out []string
	for i := 0; i < 10; i++ {
		out = append(out, base.String())
		base = base.Next()
	}
	return out
}

// fill creates services (and their slices) up to size; the first call also
// creates the iperf3 service (one backend, the first backend address).
func (b *bench) fill(ctx context.Context, size int) error {
	if !b.iperfIP.IsValid() {
		s, err := b.cs.CoreV1().Services(benchNS).Create(ctx, service("iperf", iperfPort, iperfPort), metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("iperf service: %w", err)
		}
		if _, err := b.cs.DiscoveryV1().EndpointSlices(benchNS).Create(ctx, slice("iperf", []string{backendBase}, iperfPort), metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("iperf slice: %w", err)
		}
		b.iperfIP = netip.MustParseAddr(s.Spec.ClusterIP)
	}
	if d := b.c.directAbove; d > 0 && size > d {
		if len(b.services) < d {
			if err := b.fill(ctx, d); err != nil {
				return err
			}
		}
		return b.fillDirect(ctx, size)
	}
	from := len(b.services)
	ips := make([]netip.Addr, size-from)
	if err := b.parallel(from, size, func(i int) error {
		name := fmt.Sprintf("svc-%d", i)
		s, err := b.cs.CoreV1().Services(benchNS).Create(ctx, service(name, svcPort, backendPort), metav1.CreateOptions{})
		if err == nil {
			_, err = b.cs.DiscoveryV1().EndpointSlices(benchNS).Create(ctx, slice(name, backendAddrs(), backendPort), metav1.CreateOptions{})
		}
		if err != nil {
			return fmt.Errorf("create %s: %w", name, err)
		}
		ips[i-from] = netip.MustParseAddr(s.Spec.ClusterIP)
		return nil
	}); err != nil {
		return err
	}
	b.services = append(b.services, ips...)
	return nil
}

// parallel runs fn(i) for i in [from, to) on the configured number of
// workers and returns one of the errors, if any.
func (b *bench) parallel(from, to int, fn func(i int) error) error {
	work := make(chan int)
	errc := make(chan error, 1)
	var wg sync.WaitGroup
	for w := 0; w < b.c.workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := fn(i); err != nil {
					select {
					case errc <- err:
					default:
					}
				}
			}
		}()
	}
	for i := from; i < to; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

// topology is one fresh set of namespaces and listeners.
type topology struct {
	listeners []net.Listener
	iperf     *exec.Cmd
}

func sh(args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

func nsPath(name string) string { return namedns.Path(name) }

func deleteNamespaces() {
	for _, n := range []string{nodeNS, clientNS, backNS} {
		_ = namedns.Delete(n)
	}
}

func newTopology() (*topology, error) {
	deleteNamespaces()
	// Made by ip(8), not namedns.Create: that unshares on a thread it then
	// ends, and a thread that ends kills the control plane's processes it
	// happened to start (their parent-death signal follows the thread).
	for _, n := range []string{nodeNS, clientNS, backNS} {
		if err := sh("ip", "netns", "add", n); err != nil {
			return nil, err
		}
	}
	cmds := [][]string{
		{"ip", "-n", nodeNS, "link", "set", "lo", "up"},
		{"ip", "-n", clientNS, "link", "set", "lo", "up"},
		{"ip", "-n", backNS, "link", "set", "lo", "up"},
		{"ip", "link", "add", "kpc", "netns", nodeNS, "type", "veth", "peer", "name", "eth0", "netns", clientNS},
		{"ip", "link", "add", "kpb", "netns", nodeNS, "type", "veth", "peer", "name", "eth0", "netns", backNS},
		{"ip", "-n", nodeNS, "addr", "add", nodeIP + "/24", "dev", "kpc"},
		{"ip", "-n", nodeNS, "addr", "add", "10.244.2.254/24", "dev", "kpb"},
		{"ip", "-n", nodeNS, "link", "set", "kpc", "up"},
		{"ip", "-n", nodeNS, "link", "set", "kpb", "up"},
		{"ip", "-n", clientNS, "addr", "add", clientIP + "/24", "dev", "eth0"},
		{"ip", "-n", clientNS, "link", "set", "eth0", "up"},
		{"ip", "-n", clientNS, "route", "add", "default", "via", nodeIP},
		{"ip", "-n", backNS, "link", "set", "eth0", "up"},
		{"nsenter", "--net=" + nsPath(nodeNS), "sysctl", "-qw", "net.ipv4.ip_forward=1"},
	}
	a := netip.MustParseAddr(backendBase)
	for i := 0; i < 11; i++ {
		cmds = append(cmds, []string{"ip", "-n", backNS, "addr", "add", a.String() + "/24", "dev", "eth0"})
		a = a.Next()
	}
	cmds = append(cmds, []string{"ip", "-n", backNS, "route", "add", "default", "via", "10.244.2.254"})
	for _, c := range cmds {
		if err := sh(c...); err != nil {
			return nil, err
		}
	}
	t := &topology{}
	for _, l := range []struct {
		addr  string
		reply byte
	}{{fmt.Sprintf("0.0.0.0:%d", backendPort), '1'}, {fmt.Sprintf("%s:%d", changedIP, changedPort), '2'}} {
		var ln net.Listener
		err := namedns.InNetns(nsPath(backNS), func() (err error) { ln, err = net.Listen("tcp", l.addr); return err })
		if err != nil {
			t.close()
			return nil, fmt.Errorf("listen %s: %w", l.addr, err)
		}
		t.listeners = append(t.listeners, ln)
		go serve(ln, l.reply)
	}
	t.iperf = exec.Command("nsenter", "--net="+nsPath(backNS), "iperf3", "-s", "-B", backendBase, "-p", strconv.Itoa(iperfPort))
	if err := t.iperf.Start(); err != nil {
		t.close()
		return nil, fmt.Errorf("iperf3 server: %w", err)
	}
	return t, nil
}

// serve answers every connection with one byte (which backend it is).
func serve(ln net.Listener, reply byte) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		_, _ = c.Write([]byte{reply})
		_ = c.Close()
	}
}

func (t *topology) close() {
	for _, l := range t.listeners {
		_ = l.Close()
	}
	if t.iperf != nil && t.iperf.Process != nil {
		_ = t.iperf.Process.Kill()
		_ = t.iperf.Wait()
	}
	deleteNamespaces()
}

// proxy is a running tendril-agent or kube-proxy in the node namespace.
type proxy struct {
	cmd     *exec.Cmd
	started time.Time
	synced  chan time.Time // tendril: when its caches synced
	logs    *tail
	bpfRoot string
	dir     string
	exited  chan struct{}
	env     []string // nil: the benchmark's
}

// tail keeps the last lines of a process's output.
type tail struct {
	mu    sync.Mutex
	lines []string
}

func (t *tail) add(l string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lines = append(t.lines, l)
	if len(t.lines) > 60 {
		t.lines = t.lines[1:]
	}
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Join(t.lines, "\n")
}

func (b *bench) startProxy(mode string) (*proxy, error) {
	dir, err := os.MkdirTemp("", "tdrkp-"+mode+"-")
	if err != nil {
		return nil, err
	}
	p := &proxy{dir: dir, synced: make(chan time.Time, 1), logs: &tail{}, exited: make(chan struct{})}
	var args []string
	switch mode {
	case "tendril", "tendril-baseline":
		p.bpfRoot = "/sys/fs/bpf/tdrkp-" + filepath.Base(dir)
		bin := b.c.agentBin
		if mode == "tendril-baseline" {
			bin = b.c.baselineAgent
		}
		args = []string{bin, "--kubeconfig", b.kubeconfig, "--node-name", nodeName,
			"--state-dir", filepath.Join(dir, "state"), "--socket", filepath.Join(dir, "agent.sock"), "--bpf-root", p.bpfRoot,
			"--enable-datapath=true", "--install-host-networking=false", "--prometheus-serve-addr=",
			"--ipv4-range", "10.244.1.0/24", "--ipv6-range", "none", "--cgroup-root", b.cgroup}
		if b.c.heapDir != "" {
			args = append(args, "--pprof-serve-addr", agentPprof)
		}
	default:
		proxyMode := mode
		if mode == "iptables-legacy" {
			// iptables mode over the legacy x_tables backend: iptables*
			// on its PATH are the -legacy commands (Debian's default
			// iptables is the nf_tables backend).
			proxyMode = "iptables"
			bin := filepath.Join(dir, "bin")
			if err := os.Mkdir(bin, 0o755); err != nil {
				return nil, err
			}
			for c, l := range map[string]string{"iptables": "iptables-legacy", "iptables-save": "iptables-legacy-save",
				"iptables-restore": "iptables-legacy-restore", "ip6tables": "ip6tables-legacy", "ip6tables-save": "ip6tables-legacy-save",
				"ip6tables-restore": "ip6tables-legacy-restore"} {
				legacy, err := exec.LookPath(l)
				if err != nil {
					return nil, fmt.Errorf("iptables-legacy mode: %w", err)
				}
				if err := os.Symlink(legacy, filepath.Join(bin, c)); err != nil {
					return nil, err
				}
			}
			p.env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"))
		}
		args = []string{b.c.kubeProxy, "--kubeconfig", b.kubeconfig, "--hostname-override", nodeName, "--proxy-mode", proxyMode,
			"--metrics-bind-address", "127.0.0.1:10249", "--healthz-bind-address", "127.0.0.1:10256",
			"--conntrack-max-per-core", "0", "--conntrack-tcp-timeout-established", "0", "--conntrack-tcp-timeout-close-wait", "0",
			"--cluster-cidr", "10.244.0.0/16", "--v", "1"}
	}
	p.cmd = exec.Command("nsenter", append([]string{"--net=" + nsPath(nodeNS)}, args...)...)
	p.cmd.Env = p.env
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p.cmd.Stderr = p.cmd.Stdout
	p.started = time.Now()
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", mode, err)
	}
	go func() {
		defer close(p.exited)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			l := sc.Text()
			if strings.Contains(l, "Kubernetes caches synced") {
				select {
				case p.synced <- time.Now():
				default:
				}
			}
			if !strings.Contains(l, "flags.go") { // kube-proxy's flag dump
				p.logs.add(l)
			}
		}
	}()
	return p, nil
}

func (p *proxy) stop() {
	_ = p.cmd.Process.Kill()
	<-p.exited
	_ = p.cmd.Wait()
	if p.bpfRoot != "" {
		// Removing the pins releases the socket LB links on the cgroup.
		_ = os.RemoveAll(p.bpfRoot)
	}
	_ = os.RemoveAll(p.dir)
}

// connect opens one TCP connection from the client namespace (a socket made
// there before) and returns the connect time and the backend's byte.
func connect(dst netip.AddrPort, read bool) (time.Duration, byte, error) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, 0, err
	}
	defer syscall.Close(fd)
	// No TIME_WAIT left behind: close with a reset.
	_ = syscall.SetsockoptLinger(fd, syscall.SOL_SOCKET, syscall.SO_LINGER, &syscall.Linger{Onoff: 1, Linger: 0})
	_ = syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_SNDTIMEO, &syscall.Timeval{Sec: 1})
	_ = syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &syscall.Timeval{Sec: 1})
	sa := &syscall.SockaddrInet4{Port: int(dst.Port()), Addr: dst.Addr().As4()}
	t0 := time.Now()
	if err := syscall.Connect(fd, sa); err != nil {
		return 0, 0, err
	}
	d := time.Since(t0)
	if !read {
		return d, 0, nil
	}
	buf := make([]byte, 1)
	if n, err := syscall.Read(fd, buf); err != nil || n != 1 {
		return d, 0, fmt.Errorf("read from %s: %d bytes, %v", dst, n, err)
	}
	return d, buf[0], nil
}

// hookStats starts counting the run time of the agent's connect4 socket
// hook (kernel BPF statistics, on while counting); the returned function
// stops and returns the mean ns per call since (0 without the hook).
func hookStats(bpfRoot string) func() float64 {
	none := func() float64 { return 0 }
	if bpfRoot == "" {
		return none
	}
	lk, err := link.LoadPinnedLink(filepath.Join(bpfRoot, "socklb", "connect4"), nil)
	if err != nil {
		log.Printf("connect4 hook statistics: %v", err)
		return none
	}
	defer lk.Close()
	info, err := lk.Info()
	if err != nil {
		log.Printf("connect4 hook statistics: %v", err)
		return none
	}
	prog, err := ebpf.NewProgramFromID(info.Program)
	if err != nil {
		log.Printf("connect4 hook statistics: %v", err)
		return none
	}
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		prog.Close()
		log.Printf("connect4 hook statistics: %v", err)
		return none
	}
	before, err := prog.Stats()
	if err != nil {
		stats.Close()
		prog.Close()
		return none
	}
	return func() float64 {
		defer prog.Close()
		defer stats.Close()
		after, err := prog.Stats()
		if err != nil || after.RunCount == before.RunCount {
			return 0
		}
		return float64(after.Runtime-before.Runtime) / float64(after.RunCount-before.RunCount)
	}
}

// inClient runs fn on a thread in the client pod's namespace.
func inClient(fn func() error) error { return namedns.InNetns(nsPath(clientNS), fn) }

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(float64(len(s)-1) * p)
	return s[i]
}

// waitAll waits until every service answers from the client pod (each
// probed until it does, in order), up to limit.
func (b *bench) waitAll(size int, limit time.Duration, p *proxy) error {
	deadline := time.Now().Add(limit)
	targets := append(slices.Clone(b.services[:size]), b.iperfIP)
	return inClient(func() error {
		for i, ip := range targets {
			port := uint16(svcPort)
			if i == size {
				port = iperfPort
			}
			for {
				_, _, err := connect(netip.AddrPortFrom(ip, port), false)
				if err == nil {
					break
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("service %d (%s) not answering after %s: %v\n%s", i, ip, limit, err, p.logs)
				}
				select {
				case <-p.exited:
					return fmt.Errorf("proxy exited: %s", p.logs)
				default:
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
		return nil
	})
}

func (b *bench) point(ctx context.Context, size int, mode string) (result, error) {
	r := result{size: size, mode: mode}
	topo, err := newTopology()
	if err != nil {
		return r, err
	}
	defer topo.close()
	fwd, err := namedns.ForwardInto(nsPath(nodeNS), b.apiAddr)
	if err != nil {
		return r, fmt.Errorf("forward the API server: %w", err)
	}
	defer fwd.Close()
	p, err := b.startProxy(mode)
	if err != nil {
		return r, err
	}
	defer p.stop()

	if isTendril(mode) {
		want := size + 2 // the bench services, iperf, kubernetes
		var synced time.Time
		select {
		case synced = <-p.synced:
		case <-p.exited:
			return r, fmt.Errorf("agent exited: %s", p.logs)
		case <-time.After(3 * time.Minute):
			return r, fmt.Errorf("agent caches not synced: %s", p.logs)
		}
		for {
			n := countFrontends(p.bpfRoot)
			if n >= want {
				r.syncToMaps = time.Since(synced)
				break
			}
			if time.Since(synced) > 2*time.Minute {
				return r, fmt.Errorf("maps hold %d of %d frontends 2 min after the sync: %s", n, want, p.logs)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	if err := b.waitAll(size, b.c.readyLimit, p); err != nil {
		return r, err
	}
	r.ready = time.Since(p.started)

	// Connect latency to random services.
	rng := rand.New(rand.NewPCG(uint64(size), 7))
	var lat, floor []time.Duration
	direct := netip.AddrPortFrom(netip.MustParseAddr(backendBase), backendPort)
	hook := hookStats(p.bpfRoot)
	err = inClient(func() error {
		for i := 0; i < b.c.connects+100; i++ {
			dst := netip.AddrPortFrom(b.services[rng.IntN(size)], svcPort)
			d, _, err := connect(dst, false)
			if err != nil {
				r.failed++
				continue
			}
			// The floor, right after: the same connect to the
			// backend's own address.
			f, _, ferr := connect(direct, false)
			if i >= 100 { // warm-up
				lat = append(lat, d)
				if ferr == nil {
					floor = append(floor, f)
				}
			}
		}
		return nil
	})
	if err != nil {
		return r, err
	}
	r.p50, r.p99 = percentile(lat, 0.5), percentile(lat, 0.99)
	r.floorP50, r.floorP99 = percentile(floor, 0.5), percentile(floor, 0.99)
	r.hookNs = hook()
	if size == b.c.programSize {
		if err := b.oneChange(ctx, &r, size, rng); err != nil {
			return r, err
		}
		if !isTendril(mode) {
			r.metrics = scrapeKubeProxy()
		}
		if err := b.throughput(&r); err != nil {
			return r, err
		}
	} else if b.c.changesAt[size] {
		if err := b.oneChange(ctx, &r, size, rng); err != nil {
			return r, err
		}
	}
	if b.c.settle > 0 {
		time.Sleep(b.c.settle)
	}
	r.mem = procmem.Read(p.cmd.Process.Pid)
	r.rssMiB = r.mem.RSS
	if isTendril(mode) && b.c.heapDir != "" {
		if err := saveHeap(filepath.Join(b.c.heapDir, fmt.Sprintf("heap-%s-%d.pprof", mode, size))); err != nil {
			log.Printf("heap profile: %v", err)
		}
		if h, err := agentHeap(); err != nil {
			log.Printf("live heap: %v", err)
		} else {
			r.heap = h
		}
	}
	// Move the changed services back for the next mode.
	if size == b.c.programSize || b.c.changesAt[size] {
		if err := b.restoreChanged(ctx); err != nil {
			return r, err
		}
	}
	return r, nil
}

func (b *bench) oneChange(ctx context.Context, r *result, size int, rng *rand.Rand) error {
	var lat, watchLat []time.Duration
	used := map[int]bool{}
	// The floor: the same change seen by a plain watch of this process
	// (update, etcd, the API server's watch cache, the event on the
	// wire), which any proxy waits for before it can act.
	seen, stop, err := b.watchSlices(ctx)
	if err != nil {
		return err
	}
	defer stop()
	for i := 0; i < b.c.changes; i++ {
		k := rng.IntN(size)
		for used[k] {
			k = rng.IntN(size)
		}
		used[k] = true
		name := fmt.Sprintf("svc-%d", k)
		es := slice(name, []string{changedIP}, changedPort)
		// As the EndpointSlice controller does: kube-proxy measures its
		// network programming latency from this time.
		es.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: time.Now().Format(time.RFC3339Nano)}
		dst := netip.AddrPortFrom(b.services[k], svcPort)
		t0 := time.Now()
		if _, err := b.cs.DiscoveryV1().EndpointSlices(benchNS).Update(ctx, es, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("update %s: %w", name, err)
		}
		err := inClient(func() error {
			for {
				_, who, err := connect(dst, true)
				if err == nil && who == '2' {
					lat = append(lat, time.Since(t0))
					return nil
				}
				if time.Since(t0) > 30*time.Second {
					return fmt.Errorf("%s not moved to the new backend after 30 s (last: %v)", name, err)
				}
				time.Sleep(100 * time.Microsecond)
			}
		})
		if err != nil {
			return err
		}
		if at, ok := seen(name+"-1", time.Second); ok {
			watchLat = append(watchLat, at.Sub(t0))
		}
		b.changedSvcs = append(b.changedSvcs, k)
		time.Sleep(100 * time.Millisecond)
	}
	r.changeN = len(lat)
	r.changeP50, r.change99 = percentile(lat, 0.5), percentile(lat, 0.99)
	r.watchP50, r.watchP99 = percentile(watchLat, 0.5), percentile(watchLat, 0.99)
	return nil
}

// watchSlices watches the bench's EndpointSlices from now on; seen(name,
// wait) is when the latest modification of slice name arrived (waiting up
// to wait for it), and forgets it.
func (b *bench) watchSlices(ctx context.Context) (seen func(string, time.Duration) (time.Time, bool), stop func(), err error) {
	l, err := b.cs.DiscoveryV1().EndpointSlices(benchNS).List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return nil, nil, fmt.Errorf("list slices: %w", err)
	}
	w, err := b.cs.DiscoveryV1().EndpointSlices(benchNS).Watch(ctx, metav1.ListOptions{ResourceVersion: l.ResourceVersion})
	if err != nil {
		return nil, nil, fmt.Errorf("watch slices: %w", err)
	}
	var mu sync.Mutex
	arrived := map[string]time.Time{}
	go func() {
		for ev := range w.ResultChan() {
			now := time.Now()
			if es, ok := ev.Object.(*discoveryv1.EndpointSlice); ok && ev.Type == watch.Modified {
				mu.Lock()
				arrived[es.Name] = now
				mu.Unlock()
			}
		}
	}()
	seen = func(name string, wait time.Duration) (time.Time, bool) {
		for deadline := time.Now().Add(wait); ; time.Sleep(time.Millisecond) {
			mu.Lock()
			at, ok := arrived[name]
			delete(arrived, name)
			mu.Unlock()
			if ok || time.Now().After(deadline) {
				return at, ok
			}
		}
	}
	return seen, w.Stop, nil
}

func (b *bench) restoreChanged(ctx context.Context) error {
	for _, k := range b.changedSvcs {
		name := fmt.Sprintf("svc-%d", k)
		if _, err := b.cs.DiscoveryV1().EndpointSlices(benchNS).Update(ctx, slice(name, backendAddrs(), backendPort), metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("restore %s: %w", name, err)
		}
	}
	b.changedSvcs = nil
	return nil
}

// throughput alternates iperf3 client pod -> backend pod and client pod ->
// ClusterIP -> backend pod, twice each; the medians are compared.
func (b *bench) throughput(r *result) error {
	var pod, svc []float64
	for round := 0; round < 2; round++ {
		for _, dst := range []string{backendBase, b.iperfIP.String()} {
			g, err := iperf(dst, b.c.iperfTime)
			if err != nil {
				return err
			}
			if dst == backendBase {
				pod = append(pod, g)
			} else {
				svc = append(svc, g)
			}
		}
	}
	r.podGbps, r.svcGbps = mean(pod), mean(svc)
	return nil
}

func mean(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

func iperf(dst string, seconds int) (float64, error) {
	var out []byte
	var err error
	for try := 0; try < 3; try++ { // the server serves one test at a time
		out, err = exec.Command("nsenter", "--net="+nsPath(clientNS), "iperf3", "-c", dst, "-p", strconv.Itoa(iperfPort),
			"-t", strconv.Itoa(seconds), "-f", "g").CombinedOutput()
		if err == nil {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err != nil {
		return 0, fmt.Errorf("iperf3 to %s: %w: %s", dst, err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "receiver") {
			f := strings.Fields(l)
			for i, x := range f {
				if x == "Gbits/sec" && i > 0 {
					return strconv.ParseFloat(f[i-1], 64)
				}
			}
		}
	}
	return 0, fmt.Errorf("iperf3 to %s: no receiver line: %s", dst, out)
}

// countFrontends counts the frontends in the agent's pinned service map.
func countFrontends(root string) int {
	m, err := maps.OpenPinnedLB(root, true)
	if err != nil {
		return 0
	}
	defer m.Close()
	n, err := m.ServiceMap().Count()
	if err != nil {
		return 0
	}
	return n
}

// scrapeKubeProxy summarizes kube-proxy's sync metrics (read from inside
// the node namespace).
func scrapeKubeProxy() string {
	var body string
	err := namedns.InNetns(nsPath(nodeNS), func() error {
		c, err := net.DialTimeout("tcp", "127.0.0.1:10249", 2*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
		b, _ := io.ReadAll(c)
		body = string(b)
		return nil
	})
	if err != nil || body == "" {
		return fmt.Sprintf("metrics not read: %v", err)
	}
	// Every sync and programming histogram kube-proxy exports.
	var parts []string
	seen := map[string]bool{}
	for _, l := range strings.Split(body, "\n") {
		metric, _, _ := strings.Cut(strings.Fields(l + " x")[0], "{")
		name, ok := strings.CutSuffix(metric, "_count")
		if !ok || seen[name] || !(strings.HasPrefix(name, "kubeproxy_sync_") || strings.HasPrefix(name, "kubeproxy_network_programming")) {
			continue
		}
		seen[name] = true
		if s := histogram(body, name); s != "" {
			parts = append(parts, strings.TrimPrefix(name, "kubeproxy_")+" "+s)
		}
	}
	return strings.Join(parts, "; ")
}

// histogram returns "n=N mean=X p99<=Y" for a Prometheus histogram (its
// IPv4 series when it has an ip_family label).
func histogram(body, name string) string {
	var sum, count float64
	type bucket struct{ le, n float64 }
	var bs []bucket
	for _, l := range strings.Split(body, "\n") {
		f := strings.Fields(l)
		if len(f) != 2 || strings.HasPrefix(l, "#") {
			continue
		}
		metric, labels, _ := strings.Cut(f[0], "{")
		if strings.Contains(labels, "ip_family=") && !strings.Contains(labels, `ip_family="IPv4"`) {
			continue
		}
		v, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			continue
		}
		switch metric {
		case name + "_sum":
			sum = v
		case name + "_count":
			count = v
		case name + "_bucket":
			_, rest, _ := strings.Cut(labels, `le="`)
			le, err := strconv.ParseFloat(strings.SplitN(rest, `"`, 2)[0], 64)
			if err != nil {
				le = math.Inf(1)
			}
			bs = append(bs, bucket{le, v})
		}
	}
	if count == 0 {
		return ""
	}
	p99 := "?"
	for _, x := range bs {
		if x.n >= 0.99*count {
			p99 = fmt.Sprintf("%gms", x.le*1000)
			break
		}
	}
	return fmt.Sprintf("n=%.0f mean=%.1fms p99<=%s", count, sum/count*1000, p99)
}

func report(rs []result, c config) {
	fmt.Println()
	fmt.Println("| services | mode | connect p50 | connect p99 | pod->pod connect p50 / p99 (floor) | connect4 hook ns/call | failed | ready after start | caches synced -> maps | RSS MiB | RssAnon / RssFile / VmHWM MiB | live heap MiB |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rs {
		if r.err != "" {
			fmt.Printf("| %d | %s | failed: %s |||||||||||\n", r.size, r.mode, r.err)
			continue
		}
		s2m := "—"
		if isTendril(r.mode) {
			s2m = r.syncToMaps.Round(time.Millisecond).String()
		}
		hook := "—"
		if r.hookNs > 0 {
			hook = fmt.Sprintf("%.0f", r.hookNs)
		}
		live := "—"
		if r.heap.Live > 0 {
			live = fmt.Sprintf("%.1f", r.heap.Live)
		}
		fmt.Printf("| %d | %s | %s | %s | %s / %s | %s | %d | %s | %s | %.0f | %.0f / %.0f / %.0f | %s |\n", r.size, r.mode, us(r.p50), us(r.p99), us(r.floorP50), us(r.floorP99),
			hook, r.failed, r.ready.Round(time.Millisecond), s2m, r.rssMiB, r.mem.Anon, r.mem.File, r.mem.HWM, live)
	}
	fmt.Println()
	for _, r := range rs {
		if r.heap.Live > 0 {
			fmt.Printf("- %s at %d services, the runtime's account after a forced GC: %s\n", r.mode, r.size, r.heap)
		}
	}
	for _, r := range rs {
		if c.changesAt[r.size] && r.size != c.programSize && r.err == "" {
			fmt.Printf("- one change realized at %d services, %s: p50 %s / p99 %s (%d); a plain watch saw it after p50 %s / p99 %s\n", r.size, r.mode,
				r.changeP50.Round(10*time.Microsecond), r.change99.Round(10*time.Microsecond), r.changeN,
				r.watchP50.Round(10*time.Microsecond), r.watchP99.Round(10*time.Microsecond))
		}
	}
	fmt.Println()
	fmt.Printf("At %d services:\n\n", c.programSize)
	fmt.Println("| mode | one change realized p50 / p99 (n) | a plain watch saw it p50 / p99 | pod->pod Gbit/s | pod->ClusterIP->pod Gbit/s | ratio | kube-proxy metrics |")
	fmt.Println("|---|---|---|---|---|---|---|")
	for _, r := range rs {
		if r.size != c.programSize || r.err != "" {
			continue
		}
		fmt.Printf("| %s | %s / %s (%d) | %s / %s | %.2f | %.2f | %.1f%% | %s |\n", r.mode, r.changeP50.Round(10*time.Microsecond), r.change99.Round(10*time.Microsecond),
			r.changeN, r.watchP50.Round(10*time.Microsecond), r.watchP99.Round(10*time.Microsecond), r.podGbps, r.svcGbps, 100*r.svcGbps/r.podGbps, r.metrics)
	}
	// Ratios the targets name.
	by := map[string]result{}
	for _, r := range rs {
		by[fmt.Sprint(r.mode, r.size)] = r
	}
	fmt.Println()
	if t, ok := by[fmt.Sprint("tendril", c.programSize)]; ok {
		if ipt, ok := by[fmt.Sprint("iptables", c.programSize)]; ok {
			fmt.Printf("- p99 at %d: iptables / tendril = %.1fx\n", c.programSize, float64(ipt.p99)/float64(t.p99))
		}
		if l, ok := by[fmt.Sprint("iptables-legacy", c.programSize)]; ok && l.p99 > 0 {
			fmt.Printf("- p99 at %d: iptables-legacy / tendril = %.1fx\n", c.programSize, float64(l.p99)/float64(t.p99))
		}
		if nft, ok := by[fmt.Sprint("nftables", c.programSize)]; ok {
			fmt.Printf("- p99 at %d: nftables / tendril = %.1fx\n", c.programSize, float64(nft.p99)/float64(t.p99))
		}
	}
	first, last := by[fmt.Sprint("tendril", c.sizes[0])], by[fmt.Sprint("tendril", c.sizes[len(c.sizes)-1])]
	if first.p50 > 0 && last.p50 > 0 {
		fmt.Printf("- tendril %d -> %d services: p50 %+.1f%%, p99 %+.1f%%\n", c.sizes[0], c.sizes[len(c.sizes)-1],
			100*(float64(last.p50)/float64(first.p50)-1), 100*(float64(last.p99)/float64(first.p99)-1))
	}
}

func us(d time.Duration) string { return fmt.Sprintf("%.0f µs", float64(d)/1e3) }

// agentPprof is where the agent serves pprof, in the node's namespace.
const agentPprof = "127.0.0.1:6060"

// saveHeap writes the agent's heap profile (after a GC: gc=1) to path.
func saveHeap(path string) error {
	body, err := agentPprofGet("/debug/pprof/heap?gc=1")
	if err != nil {
		return err
	}
	return os.WriteFile(path, body, 0o644)
}

// agentHeap is the runtime's account of the agent's memory after a
// forced GC (its live heap, the spans holding it, stacks, metadata).
func agentHeap() (procmem.Heap, error) {
	body, err := agentPprofGet("/debug/pprof/heap?gc=1&debug=1")
	if err != nil {
		return procmem.Heap{}, err
	}
	return procmem.ParseHeap(body)
}

// agentPprofGet fetches path from the agent's pprof server in the node
// namespace.
func agentPprofGet(path string) ([]byte, error) {
	return procmem.PprofGet(nsPath(nodeNS), agentPprof, path)
}
