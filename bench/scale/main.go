// Command scale runs one real tendril-agent (datapath loaded, in a network
// namespace of its own) against a real kube-apiserver + etcd holding the
// rest of a large cluster (issue 31): remote Nodes and TendrilNodes with
// pod CIDRs, pods as TendrilEndpoints (CRD identity mode) or kvstore keys
// (kvstore mode) with identities over app × version label sets, Services
// with EndpointSlices, NetworkPolicies and TendrilNetworkPolicies. A few
// local pods (real network namespaces, added through tendril-cni) are
// selected by policies that select remote pods.
//
// Per identity mode it measures: the time from the agent's start to its
// caches synced, to the ipcache map holding every pod, to the identities
// table holding every identity, and to every local endpoint's policy map
// holding every identity its policies allow; the agent's RSS and CPU in
// steady state; the time for a new remote pod with a new identity to reach
// every local policy map (and the ipcache map), p50/p99, quiet and under
// churn (pods created and deleted at -churn-rate); tendril-operator's RSS
// on the same data. It prints Markdown.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tendril-net/tendril/bench/internal/procmem"
	"github.com/tendril-net/tendril/pkg/client"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/dbinspect"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/k8s"
	"github.com/tendril-net/tendril/pkg/k8s/crdinstall"
	"github.com/tendril-net/tendril/pkg/namedns"
	"github.com/tendril-net/tendril/pkg/testutil/k8senv"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	localNode   = "scale-node"
	localCIDR   = "10.64.0.0/24"
	localNodeIP = "172.19.255.1"
	nodeNS      = "tdrsc-n"
	podNSPrefix = "tdrsc-p"
	agentPprof  = "127.0.0.1:6060"
)

type bench struct {
	cl         cluster
	clients    *k8s.Clients
	kubeconfig string
	apiAddr    string
	etcdURL    string
	workers    int
	direct     bool
	agentBin   string
	// agents are the agent binaries measured in each mode, one after the
	// other against the same filled cluster (-agents; default: -agent).
	agents []agentBinary
	// settle is a quiet pause between every policy map being full and the
	// steady window whose end is the memory reading: the agent's heaptrim
	// returns the idle heap only after allocation has been quiet for a
	// while, at most once every 2 min, so a reading right after the sync
	// would miss it.
	settle    time.Duration
	cniBin    string
	opBin     string
	local     int
	newPods   int
	churnRate int
	churnFor  time.Duration
	steady    time.Duration
	heapDir   string
	// api is the running agent's API; known, when the agent's identity
	// API first knew each new pod's identity (0: not seen before the maps).
	api   *client.Client
	known []time.Duration
	// nextPod numbers the pods made after the fill (cluster.newPod).
	nextPod int
}

func (b *bench) logf(format string, args ...any) { log.Printf(format, args...) }

// agentBinary is one agent binary under test and its label in the report.
type agentBinary struct{ label, path string }

// parseAgents reads -agents: label=path pairs, comma-separated.
func parseAgents(s string) ([]agentBinary, error) {
	var out []agentBinary
	for _, f := range strings.Split(s, ",") {
		label, path, ok := strings.Cut(strings.TrimSpace(f), "=")
		if !ok || label == "" || path == "" {
			return nil, fmt.Errorf("-agents: %q is not label=path", f)
		}
		out = append(out, agentBinary{label: label, path: path})
	}
	return out, nil
}

// result is one identity mode's numbers.
type result struct {
	mode  string
	agent string // the agentBinary's label
	mem   procmem.Mem
	// liveMiB is the agent's heap in use after a forced GC, read after
	// the memory reading (0: not read).
	liveMiB                         float64
	synced, ipcache, idents, policy time.Duration
	cniDone                         time.Duration
	rssMiB, cpuPct                  float64
	newP50, newP99, newMax          time.Duration
	ipcP50, ipcP99                  time.Duration
	// floor*: when a plain watch of this process saw the new pods.
	floorP50, floorP99, churnFloorP50, churnFloorP99 time.Duration
	newN                                             int
	churnP50, churnP99, churnMax                     time.Duration
	churnN, churnOps                                 int
	churnRSS, churnCPU                               float64
	churnAchieved                                    float64
	opRSS                                            float64
	opSynced                                         time.Duration
	err                                              string
}

func main() {
	b := &bench{}
	var modes string
	flag.IntVar(&b.cl.nodes, "nodes", 1000, "remote nodes")
	flag.IntVar(&b.cl.pods, "pods", 50000, "remote pods")
	flag.IntVar(&b.cl.apps, "apps", 500, "apps (2 identities each: versions v1, v2)")
	flag.IntVar(&b.cl.namespaces, "namespaces", 50, "namespaces the apps are spread over")
	flag.IntVar(&b.cl.services, "services", 2000, "Services (an EndpointSlice of up to 10 pods each)")
	flag.IntVar(&b.cl.policies, "policies", 500, "policies (policy p selects app p%apps; half NetworkPolicy, half TendrilNetworkPolicy)")
	flag.IntVar(&b.local, "local", 10, "local pods (apps 0..local-1), added through tendril-cni")
	flag.IntVar(&b.newPods, "new-pods", 50, "new remote pods (each a new identity) measured until in every selecting policy map")
	flag.IntVar(&b.churnRate, "churn-rate", 50, "pods created and deleted per second during the churn")
	flag.DurationVar(&b.churnFor, "churn", 30*time.Second, "how long the churn runs (new pods measured meanwhile); 0: no churn")
	flag.DurationVar(&b.steady, "steady", 20*time.Second, "steady-state window for CPU")
	flag.StringVar(&modes, "modes", "crd,kvstore", "identity modes")
	flag.BoolVar(&b.direct, "direct", true, "write TendrilEndpoints into the API server's etcd (fill.go says why) instead of creating them")
	flag.IntVar(&b.workers, "workers", 16, "concurrent creates while filling")
	flag.StringVar(&b.agentBin, "agent", "bin/tendril-agent", "tendril-agent binary")
	agents := flag.String("agents", "", "label=path,... agent binaries measured one after the other in each mode against the same cluster (e.g. old=/tmp/old-agent,new=bin/tendril-agent); empty: -agent")
	flag.DurationVar(&b.settle, "settle", 150*time.Second, "quiet pause after every policy map is full, before the steady window and the memory reading (the agent returns idle heap only after a quiet spell)")
	flag.StringVar(&b.cniBin, "cni", "bin/tendril-cni", "tendril-cni binary")
	flag.StringVar(&b.opBin, "operator", "bin/tendril-operator", "tendril-operator binary (empty: not measured)")
	flag.StringVar(&b.heapDir, "heap-profiles", "", "directory for a heap profile of the agent per mode (steady state)")
	flag.Parse()
	// A missing directory would lose every profile of a run an hour long.
	if b.heapDir != "" {
		if err := os.MkdirAll(b.heapDir, 0o755); err != nil {
			log.Fatal(err)
		}
	}
	b.agents = []agentBinary{{label: "", path: b.agentBin}}
	if *agents != "" {
		var err error
		if b.agents, err = parseAgents(*agents); err != nil {
			log.Fatal(err)
		}
	}
	if err := b.cl.validate(); err != nil {
		log.Fatal(err)
	}
	if b.local > min(b.cl.apps, b.cl.policies) || b.local > 200 {
		log.Fatalf("-local %d: at most min(apps, policies) and 200", b.local)
	}
	if err := b.run(strings.Split(modes, ",")); err != nil {
		log.Fatal(err)
	}
}

func (b *bench) run(modes []string) error {
	for _, m := range modes {
		if m != "crd" && m != "kvstore" {
			return fmt.Errorf("-modes: unknown mode %q (crd, kvstore)", m)
		}
	}
	ctx := context.Background()
	cleanLeftovers()
	env, err := k8senv.Start(ctx, k8senv.Options{})
	if err != nil {
		return fmt.Errorf("control plane: %w", err)
	}
	defer env.Stop()
	rc := env.RESTConfig()
	rc.QPS, rc.Burst = 5000, 5000
	if b.clients, err = k8s.NewClientsForConfig(rc); err != nil {
		return err
	}
	b.kubeconfig, b.etcdURL = env.Kubeconfig(), env.EtcdURL()
	b.apiAddr = strings.TrimPrefix(rc.Host, "https://")
	if _, err := crdinstall.Install(ctx, b.clients.Dynamic, slog.New(slog.DiscardHandler)); err != nil {
		return fmt.Errorf("install CRDs: %w", err)
	}
	start := time.Now()
	if err := b.fillCommon(ctx); err != nil {
		return err
	}
	fmt.Printf("# scale benchmark %s: %d nodes, %d pods, %d identities, %d services, %d policies, %d local pods; load before %s\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), b.cl.nodes, b.cl.pods, b.cl.identities(), b.cl.services, b.cl.policies, b.local, loadavg())
	b.logf("common objects filled in %s", time.Since(start).Round(time.Millisecond))
	var results []result
	for i, mode := range modes {
		if i > 0 && modes[i-1] == "crd" {
			if err := b.clearCRD(ctx); err != nil {
				return err
			}
		}
		switch mode {
		case "crd":
			err = b.fillCRD(ctx)
		case "kvstore":
			err = b.fillKV(ctx)
		}
		if err != nil {
			return err
		}
		for _, a := range b.agents {
			r, err := b.point(ctx, mode, a)
			if err != nil {
				b.logf("%s %s: %v", mode, a.label, err)
				r.err = firstLine(err.Error())
			} else {
				b.logf("%s %s: RSS %.0f MiB (%s), live heap %.1f MiB, every policy map full %s, new remote pod p99 %s",
					mode, a.label, r.rssMiB, r.mem, r.liveMiB, ms(r.policy), ms(r.newP99))
			}
			results = append(results, r)
		}
	}
	report(results, b)
	return nil
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i > 0 {
		return s[:i]
	}
	return s
}

func loadavg() string {
	bs, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(bs))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func sh(args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

func nsPath(name string) string { return namedns.Path(name) }

// cleanLeftovers removes what a killed earlier run left.
func cleanLeftovers() {
	names, _ := filepath.Glob(filepath.Join(namedns.RunDir, "tdrsc-*"))
	for _, n := range names {
		_ = namedns.Delete(filepath.Base(n))
	}
	pins, _ := filepath.Glob("/sys/fs/bpf/tdrsc-*")
	for _, d := range pins {
		_ = os.RemoveAll(d)
	}
}

// newNodeNS makes the node's namespace: loopback and a veth pair (no
// dummy module here) with the node's address. Made by ip(8): a thread that ends would kill the
// control plane's processes (their parent-death signal follows it).
func newNodeNS() error {
	_ = namedns.Delete(nodeNS)
	for _, c := range [][]string{
		{"ip", "netns", "add", nodeNS},
		{"ip", "-n", nodeNS, "link", "set", "lo", "up"},
		{"ip", "link", "add", "scale0", "netns", nodeNS, "type", "veth", "peer", "name", "scale1", "netns", nodeNS},
		{"ip", "-n", nodeNS, "addr", "add", localNodeIP + "/24", "dev", "scale0"},
		{"ip", "-n", nodeNS, "link", "set", "scale0", "up"},
		{"ip", "-n", nodeNS, "link", "set", "scale1", "up"},
		{"nsenter", "--net=" + nsPath(nodeNS), "sysctl", "-qw", "net.ipv4.ip_forward=1"},
	} {
		if err := sh(c...); err != nil {
			return err
		}
	}
	return nil
}

// agentProc is the running agent.
type agentProc struct {
	cmd     *exec.Cmd
	started time.Time
	synced  chan time.Time
	ready   chan time.Time
	exited  chan struct{}
	logs    *tail
	dir     string
	bpfRoot string
	socket  string
	mode    string
}

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

// startProc starts a process (in the node namespace when ns is set) and
// signals when its log has a line containing each of the marks.
func startProc(ns string, args []string, marks map[string]chan time.Time, logs *tail) (*exec.Cmd, chan struct{}, error) {
	if ns != "" {
		args = append([]string{"nsenter", "--net=" + nsPath(ns)}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("start %s: %w", args[0], err)
	}
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			l := sc.Text()
			for m, ch := range marks {
				if strings.Contains(l, m) {
					select {
					case ch <- time.Now():
					default:
					}
				}
			}
			logs.add(l)
		}
	}()
	return cmd, exited, nil
}

func (b *bench) startAgent(mode, bin string) (*agentProc, error) {
	dir, err := os.MkdirTemp("", "tdrsc-")
	if err != nil {
		return nil, err
	}
	p := &agentProc{mode: mode, dir: dir, synced: make(chan time.Time, 1), ready: make(chan time.Time, 1), logs: &tail{},
		bpfRoot: "/sys/fs/bpf/" + filepath.Base(dir), socket: filepath.Join(dir, "agent.sock")}
	args := []string{bin, "--kubeconfig", b.kubeconfig, "--node-name", localNode,
		"--state-dir", filepath.Join(dir, "state"), "--socket", p.socket, "--bpf-root", p.bpfRoot,
		"--enable-datapath=true", "--install-host-networking=false", "--prometheus-serve-addr=",
		"--enable-health-checking=false", "--ipv6-range", "none", "--identity-allocation-mode", mode,
		"--pprof-serve-addr", agentPprof}
	if mode == "kvstore" {
		args = append(args, "--kvstore", "etcd", "--kvstore-endpoints", b.etcdURL)
	}
	p.started = time.Now()
	p.cmd, p.exited, err = startProc(nodeNS, args, map[string]chan time.Time{"Kubernetes caches synced": p.synced, "Agent ready": p.ready}, p.logs)
	if err != nil {
		return nil, err
	}
	return p, nil
}

func (p *agentProc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
	_ = p.cmd.Wait()
	_ = os.RemoveAll(p.bpfRoot)
	_ = os.RemoveAll(p.dir)
}

// procStat is a process's RSS (MiB) and CPU time so far.
func procStat(pid int) (rssMiB float64, cpu time.Duration) {
	if bs, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for _, l := range strings.Split(string(bs), "\n") {
			if rest, ok := strings.CutPrefix(l, "VmRSS:"); ok {
				kb, _ := strconv.Atoi(strings.Fields(rest)[0])
				rssMiB = float64(kb) / 1024
			}
		}
	}
	if bs, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		s := string(bs)
		if i := strings.LastIndexByte(s, ')'); i > 0 {
			f := strings.Fields(s[i+1:])
			if len(f) > 13 {
				u, _ := strconv.ParseInt(f[11], 10, 64)
				st, _ := strconv.ParseInt(f[12], 10, 64)
				cpu = time.Duration(u+st) * time.Second / 100 // USER_HZ
			}
		}
	}
	return rssMiB, cpu
}

// agentPID is the agent's own pid: nsenter execs it, so the same.
func (p *agentProc) pid() int { return p.cmd.Process.Pid }

// localPod is one local pod: its app and, once added, its endpoint ID.
type localPod struct {
	app  int
	name string
	ns   string
	epID uint16
}

// addLocalPods creates the local pods' Pod objects (the agent takes their
// labels from them) and namespaces, and adds each through tendril-cni in
// the node namespace, as a kubelet would.
func (b *bench) addLocalPods(ctx context.Context, p *agentProc) ([]*localPod, error) {
	var pods []*localPod
	for a := 0; a < b.local; a++ {
		lp := &localPod{app: a, name: fmt.Sprintf("local-%02d", a), ns: b.cl.appNS(a)}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: lp.name, Namespace: lp.ns,
			Labels: map[string]string{"app": appName(a), "role": role(a), "version": "v1"}},
			Spec: corev1.PodSpec{NodeName: localNode, ServiceAccountName: appName(a), Containers: []corev1.Container{{Name: "c", Image: "none"}}}}
		if _, err := b.clients.Core.CoreV1().Pods(lp.ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil && !strings.Contains(err.Error(), "already exists") {
			return nil, fmt.Errorf("pod %s: %w", lp.name, err)
		}
		pods = append(pods, lp)
	}
	conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"tendril","type":"tendril-cni","agent-socket":%q}`, p.socket)
	for i, lp := range pods {
		ns := fmt.Sprintf("%s%d", podNSPrefix, i)
		_ = namedns.Delete(ns)
		if err := sh("ip", "netns", "add", ns); err != nil {
			return nil, err
		}
		cmd := exec.Command("nsenter", "--net="+nsPath(nodeNS), b.cniBin)
		cmd.Env = append(os.Environ(), "CNI_COMMAND=ADD", "CNI_CONTAINERID="+fmt.Sprintf("scale%04d", i), "CNI_NETNS="+nsPath(ns),
			"CNI_IFNAME=eth0", "CNI_PATH="+filepath.Dir(b.cniBin), "CNI_ARGS=K8S_POD_NAMESPACE="+lp.ns+";K8S_POD_NAME="+lp.name)
		cmd.Stdin = strings.NewReader(conf)
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("CNI ADD %s: %w: %s", lp.name, err, out)
		}
	}
	api, err := client.New("unix://" + p.socket)
	if err != nil {
		return nil, err
	}
	eps, err := api.EndpointList(ctx)
	if err != nil {
		return nil, fmt.Errorf("list endpoints: %w", err)
	}
	for _, ep := range eps {
		if ep.Status == nil || ep.Status.ExternalIdentifiers == nil {
			continue
		}
		for _, lp := range pods {
			if ep.Status.ExternalIdentifiers.K8sPodName == lp.name && ep.Status.ExternalIdentifiers.K8sNamespace == lp.ns {
				lp.epID = uint16(ep.ID)
			}
		}
	}
	for _, lp := range pods {
		if lp.epID == 0 {
			return nil, fmt.Errorf("no endpoint for local pod %s/%s", lp.ns, lp.name)
		}
	}
	return pods, nil
}

func (b *bench) removeLocalPods(ctx context.Context) {
	for i := 0; i < b.local; i++ {
		_ = namedns.Delete(fmt.Sprintf("%s%d", podNSPrefix, i))
	}
}

// hasKey says whether endpoint ep's policy map allows id on TCP port.
func hasKey(pm *maps.PolicyMap, ep uint16, id identity.NumericIdentity, port uint16) bool {
	v, found, err := pm.Lookup(maps.PolicyKey{EndpointID: ep, Direction: maps.DirIngress, Identity: uint32(id), Proto: 6, Port: port, PortPrefixLen: 16})
	return err == nil && found && !v.Deny
}

// podsInIPCache says whether the first, middle and last pods are in the
// ipcache map with their identities.
func (b *bench) podsInIPCache(m *maps.Maps) bool {
	for _, j := range []int{0, b.cl.pods / 2, b.cl.pods - 1} {
		if j < 0 {
			continue
		}
		e, ok, err := m.IPCacheMap().LookupAddr(b.cl.podIP(j))
		if err != nil || !ok || e.Identity != uint32(b.cl.podIdentity(j)) {
			return false
		}
	}
	return true
}

// policyMissing counts the (endpoint, identity) keys not yet in the
// policy maps.
func (b *bench) policyMissing(pm *maps.PolicyMap, pods []*localPod) int {
	missing := 0
	for _, lp := range pods {
		for id, port := range b.cl.allowed(lp.app) {
			if !hasKey(pm, lp.epID, id, port) {
				missing++
			}
		}
	}
	return missing
}

// tables reads the agent's statedb table sizes.
func tables(ctx context.Context, api *client.Client) (map[string]int, error) {
	var ts []dbinspect.TableInfo
	if err := api.Do(ctx, http.MethodGet, "/statedb/tables", nil, nil, nil, &ts); err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, t := range ts {
		out[t.Name] = t.Objects
	}
	return out, nil
}

func (b *bench) point(ctx context.Context, mode string, a agentBinary) (result, error) {
	r := result{mode: mode, agent: a.label}
	if err := newNodeNS(); err != nil {
		return r, err
	}
	defer func() { _ = namedns.Delete(nodeNS) }()
	defer b.removeLocalPods(ctx)
	addrs := []string{b.apiAddr}
	if mode == "kvstore" {
		addrs = append(addrs, strings.TrimPrefix(b.etcdURL, "http://"))
	}
	for _, a := range addrs {
		ln, err := namedns.ForwardInto(nsPath(nodeNS), a)
		if err != nil {
			return r, fmt.Errorf("forward %s: %w", a, err)
		}
		defer ln.Close()
	}
	p, err := b.startAgent(mode, a.path)
	if err != nil {
		return r, err
	}
	defer p.stop()
	wait := func(ch chan time.Time, what string) (time.Duration, error) {
		select {
		case t := <-ch:
			return t.Sub(p.started), nil
		case <-p.exited:
			return 0, fmt.Errorf("agent exited before %s:\n%s", what, p.logs)
		case <-time.After(5 * time.Minute):
			return 0, fmt.Errorf("no %s after 5 min:\n%s", what, p.logs)
		}
	}
	if r.synced, err = wait(p.synced, "cache sync"); err != nil {
		return r, err
	}
	if _, err = wait(p.ready, "ready"); err != nil {
		return r, err
	}
	api, err := client.New("unix://" + p.socket)
	if err != nil {
		return r, err
	}
	b.api = api
	m, err := maps.OpenPinned(p.bpfRoot, true)
	if err != nil {
		return r, err
	}
	defer m.Close()
	// The ipcache and identities, polled while the local pods are added.
	var pollErr error
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		wantIPs, wantIDs := b.cl.pods+b.cl.nodes, b.cl.identities()
		for deadline := time.Now().Add(5 * time.Minute); r.ipcache == 0 || r.idents == 0; time.Sleep(20 * time.Millisecond) {
			if r.ipcache == 0 {
				// The count includes a few local entries: the first, middle
				// and last pods must be there too.
				if n, err := m.IPCacheMap().Count(); err == nil && n >= wantIPs && b.podsInIPCache(m) {
					r.ipcache = time.Since(p.started)
				}
			}
			if r.idents == 0 {
				if t, err := tables(ctx, api); err == nil && t["identities"] >= wantIDs {
					r.idents = time.Since(p.started)
				}
			}
			if time.Now().After(deadline) {
				n, _ := m.IPCacheMap().Count()
				t, _ := tables(ctx, api)
				pollErr = fmt.Errorf("after 5 min: ipcache map %d entries (want >= %d), identities table %d (want >= %d)", n, wantIPs, t["identities"], wantIDs)
				return
			}
		}
	}()
	pods, err := b.addLocalPods(ctx, p)
	if err != nil {
		return r, err
	}
	r.cniDone = time.Since(p.started)
	pm := m.PolicyMap()
	for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		n := b.policyMissing(pm, pods)
		if n == 0 {
			r.policy = time.Since(p.started)
			break
		}
		if time.Now().After(deadline) {
			return r, fmt.Errorf("%d policy map keys missing 5 min after the local pods were added:\n%s", n, p.logs)
		}
	}
	<-polled
	if pollErr != nil {
		return r, pollErr
	}
	b.logf("%s: synced %s, ipcache %s, identities %s, policy maps %s", mode, r.synced, r.ipcache, r.idents, r.policy)

	// Steady state, after the settle.
	time.Sleep(b.settle)
	_, cpu0 := procStat(p.pid())
	time.Sleep(b.steady)
	r.mem = procmem.Read(p.pid())
	_, cpu1 := procStat(p.pid())
	r.rssMiB, r.cpuPct = r.mem.RSS, 100*float64(cpu1-cpu0)/float64(b.steady)
	// After the reading: the forced GC would otherwise shrink it.
	if live, err := liveHeapMiB(); err != nil {
		b.logf("live heap: %v", err)
	} else {
		r.liveMiB = live
	}
	if b.heapDir != "" {
		tag := mode
		if a.label != "" {
			tag += "-" + a.label
		}
		for _, q := range []string{"gc=1", "debug=1"} {
			name := fmt.Sprintf("heap-%s-%d.pprof", tag, b.cl.nodes)
			if q == "debug=1" {
				name = fmt.Sprintf("heap-%s-%d.txt", tag, b.cl.nodes)
			}
			if err := saveHeap(filepath.Join(b.heapDir, name), q); err != nil {
				b.logf("heap profile: %v", err)
			}
		}
		b.logf("%s: %s", tag, memSummary(filepath.Join(b.heapDir, fmt.Sprintf("heap-%s-%d.txt", tag, b.cl.nodes)), p.pid()))
	}

	var w remoteWriter = crdWriter{b: b}
	if mode == "kvstore" {
		ew, err := newEtcdWriter(b.etcdURL)
		if err != nil {
			return r, err
		}
		defer ew.close()
		w = kvWriter{b: b, w: ew}
	}
	// New remote pods, quiet.
	lat, ipc, floor, err := b.newRemotePods(ctx, w, m, pods, b.newPods, 200*time.Millisecond, p)
	if err != nil {
		return r, err
	}
	r.newN = len(lat)
	r.newP50, r.newP99, r.newMax = percentile(lat, 0.5), percentile(lat, 0.99), percentile(lat, 1)
	r.ipcP50, r.ipcP99 = percentile(ipc, 0.5), percentile(ipc, 0.99)
	r.floorP50, r.floorP99 = percentile(floor, 0.5), percentile(floor, 0.99)
	b.logf("%s: identity known to the agent's API p50 %s p99 %s", mode, percentile(b.known, 0.5), percentile(b.known, 0.99))
	b.known = nil
	b.logf("%s: new remote pod in every selecting policy map p50 %s p99 %s (n=%d)", mode, r.newP50, r.newP99, r.newN)

	// The same under churn.
	if b.churnFor > 0 {
		if err := b.churn(ctx, w, m, pods, p, &r); err != nil {
			return r, err
		}
	}
	p.stop()
	if b.opBin != "" {
		if r.opRSS, r.opSynced, err = b.operatorRSS(mode); err != nil {
			return r, err
		}
	}
	return r, nil
}

// newRemotePods adds n remote pods, each with a new identity (a client
// every local endpoint's policy allows), one at a time, gap apart, and
// returns for each the time from its first write until every local
// policy map held it, and until the ipcache map did.
func (b *bench) newRemotePods(ctx context.Context, w remoteWriter, m *maps.Maps, pods []*localPod, n int, gap time.Duration, p *agentProc) (lat, ipc, floor []time.Duration, err error) {
	pm := m.PolicyMap()
	f, err := b.startWatchFloor(ctx, p.mode)
	if err != nil {
		return nil, nil, nil, err
	}
	defer f.stop()
	for i := 0; i < n; i++ {
		k := b.nextPod
		b.nextPod++
		id := identity.NumericIdentity(newIdentityBase + k%(int(identity.MaxCluster)-newIdentityBase))
		labels := b.cl.newClientLabels(k)
		_, ip := b.cl.newPod(k)
		t0 := time.Now()
		if err := w.addPod(ctx, k, id, labels, true); err != nil {
			return nil, nil, nil, fmt.Errorf("new pod %d: %w", k, err)
		}
		var inIPC, known time.Duration
		for {
			if known == 0 && b.api != nil {
				var out map[string]any
				if err := b.api.Do(ctx, http.MethodGet, fmt.Sprintf("/identity/%d", id), nil, nil, nil, &out); err == nil {
					known = time.Since(t0)
				}
			}
			if inIPC == 0 {
				if e, ok, err := m.IPCacheMap().LookupAddr(ip); err == nil && ok && e.Identity == uint32(id) {
					inIPC = time.Since(t0)
				}
			}
			all := true
			for _, lp := range pods {
				if !hasKey(pm, lp.epID, id, clientPort) {
					all = false
					break
				}
			}
			if all && inIPC > 0 {
				lat, ipc = append(lat, time.Since(t0)), append(ipc, inIPC)
				b.known = append(b.known, known)
				break
			}
			if time.Since(t0) > time.Minute {
				return nil, nil, nil, fmt.Errorf("new pod %d (identity %d, %s) not in every policy map (or the ipcache) after 1 min:\n%s", k, id, ip, p.logs)
			}
			time.Sleep(time.Millisecond)
		}
		if at, ok := f.at(ip.String(), time.Second); ok {
			floor = append(floor, at.Sub(t0))
		}
		time.Sleep(gap)
	}
	return lat, ipc, floor, nil
}

// churn creates and deletes remote pods (existing identities) at
// churnRate per second each while measuring new pods.
func (b *bench) churn(ctx context.Context, w remoteWriter, m *maps.Maps, pods []*localPod, p *agentProc, r *result) error {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var churnErr error
	ops := 0
	// The churned pods' numbers come from a range of their own, past the
	// measured ones.
	base := 1 << 20
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(time.Second / time.Duration(b.churnRate))
		defer tick.Stop()
		var live []int
		next := base
		sem := make(chan struct{}, 64)
		var inner sync.WaitGroup
		defer inner.Wait()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			k := next
			next++
			j := k % max(b.cl.pods, 1)
			id, labels := b.cl.podIdentity(j), b.cl.labelsOf(b.cl.podApp(j), versionName(b.cl.podVersion(j)))
			var del = -1
			if len(live) >= b.churnRate { // each pod lives about a second
				del, live = live[0], live[1:]
			}
			live = append(live, k)
			sem <- struct{}{}
			inner.Add(1)
			go func() {
				defer func() { <-sem; inner.Done() }()
				err := w.addPod(ctx, k, id, labels, false)
				if err == nil && del >= 0 {
					err = w.delPod(ctx, del, nil)
				}
				mu.Lock()
				defer mu.Unlock()
				if err != nil && churnErr == nil {
					churnErr = err
				}
				ops++
			}()
		}
	}()
	_, cpu0 := procStat(p.pid())
	t0 := time.Now()
	n := max(1, int(b.churnFor/(500*time.Millisecond)))
	lat, _, floor, err := b.newRemotePods(ctx, w, m, pods, n, 500*time.Millisecond, p)
	elapsed := time.Since(t0)
	rss, cpu1 := procStat(p.pid())
	close(stop)
	wg.Wait()
	if err != nil {
		return err
	}
	if churnErr != nil {
		return fmt.Errorf("churn: %w", churnErr)
	}
	r.churnN, r.churnOps = len(lat), ops
	r.churnP50, r.churnP99, r.churnMax = percentile(lat, 0.5), percentile(lat, 0.99), percentile(lat, 1)
	r.churnRSS, r.churnCPU = rss, 100*float64(cpu1-cpu0)/float64(elapsed)
	r.churnFloorP50, r.churnFloorP99 = percentile(floor, 0.5), percentile(floor, 0.99)
	r.churnAchieved = float64(ops) / elapsed.Seconds()
	b.logf("%s churn: identity known to the agent's API p50 %s p99 %s", r.mode, percentile(b.known, 0.5), percentile(b.known, 0.99))
	b.known = nil
	b.logf("%s churn: %d create+delete in %s; new pod p50 %s p99 %s; RSS %.0f MiB CPU %.0f%%", r.mode, ops, elapsed.Round(time.Second), r.churnP50, r.churnP99, rss, r.churnCPU)
	return nil
}

// operatorRSS runs tendril-operator against the same API server (its GCs
// off: the simulated endpoints have no Pod objects, which the endpoint GC
// would take as orphans) and returns its RSS 15 s after its caches synced.
func (b *bench) operatorRSS(mode string) (float64, time.Duration, error) {
	synced := make(chan time.Time, 1)
	logs := &tail{}
	args := []string{b.opBin, "--kubeconfig", b.kubeconfig, "--operator-api-serve-addr", "127.0.0.1:0",
		"--identity-allocation-mode", mode, "--identity-gc-interval", "0", "--endpoint-gc-interval", "0", "--nodes-gc-interval", "0"}
	if mode == "kvstore" {
		args = append(args, "--kvstore", "etcd", "--kvstore-endpoints", b.etcdURL)
	}
	start := time.Now()
	cmd, exited, err := startProc("", args, map[string]chan time.Time{"Informer caches synced": synced}, logs)
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = cmd.Process.Kill(); <-exited; _ = cmd.Wait() }()
	var at time.Time
	select {
	case at = <-synced:
	case <-exited:
		return 0, 0, fmt.Errorf("operator exited:\n%s", logs)
	case <-time.After(5 * time.Minute):
		return 0, 0, fmt.Errorf("operator caches not synced after 5 min:\n%s", logs)
	}
	time.Sleep(15 * time.Second)
	rss, _ := procStat(cmd.Process.Pid)
	return rss, at.Sub(start), nil
}

// memSummary is the Go runtime's view of the agent's memory (from the
// debug=1 heap profile's MemStats) beside the kernel's (VmRSS, VmHWM).
func memSummary(path string, pid int) string {
	bs, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	var parts []string
	for _, l := range strings.Split(string(bs), "\n") {
		for _, k := range []string{"# HeapAlloc", "# HeapInuse", "# HeapIdle", "# HeapReleased", "# Sys", "# NextGC", "# Stack", "# MSpan"} {
			if rest, ok := strings.CutPrefix(l, k+" = "); ok {
				n, _ := strconv.ParseFloat(strings.Fields(rest)[0], 64)
				parts = append(parts, fmt.Sprintf("%s %.0f MiB", strings.TrimPrefix(k, "# "), n/(1<<20)))
			}
		}
	}
	if m := procmem.Read(pid); m.RSS > 0 {
		parts = append(parts, fmt.Sprintf("VmRSS %.0f MiB, %s", m.RSS, m))
	}
	return strings.Join(parts, ", ")
}

// saveHeap writes the agent's heap profile (query: gc=1 for the profile
// after a GC, debug=1 for the text form with MemStats) to path.
func saveHeap(path, query string) error {
	body, err := agentPprofGet("/debug/pprof/heap?" + query)
	if err != nil {
		return err
	}
	return os.WriteFile(path, body, 0o644)
}

// liveHeapMiB is the agent's heap in use after a forced GC.
func liveHeapMiB() (float64, error) {
	body, err := agentPprofGet("/debug/pprof/heap?gc=1&debug=1")
	if err != nil {
		return 0, err
	}
	return procmem.HeapAllocMiB(body)
}

// agentPprofGet fetches path from the agent's pprof server in the node
// namespace.
func agentPprofGet(path string) ([]byte, error) {
	return procmem.PprofGet(nsPath(nodeNS), agentPprof, path)
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(float64(len(s)-1)*p)]
}

func ms(d time.Duration) string {
	if d < 10*time.Millisecond {
		return fmt.Sprintf("%.1f ms", float64(d)/1e6)
	}
	return d.Round(time.Millisecond).String()
}

func report(rs []result, b *bench) {
	fmt.Printf("Memory read %s after every policy map was full (settle %s, then the steady window).\n\n", b.settle+b.steady, b.settle)
	fmt.Println("| identity mode | agent | caches synced | ipcache map full | identities table full | every local policy map full | agent RSS (steady) | RssAnon / RssFile / VmHWM | live heap (after a GC) | agent CPU (steady) | new remote pod in every selecting policy map p50 / p99 / max (n) | in the ipcache map p50 / p99 | a plain watch saw it p50 / p99 | operator RSS |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rs {
		if r.err != "" {
			fmt.Printf("| %s | %s | failed: %s ||||||||||||\n", r.mode, r.agent, r.err)
			continue
		}
		live := "—"
		if r.liveMiB > 0 {
			live = fmt.Sprintf("%.0f MiB", r.liveMiB)
		}
		op := "—"
		if r.opRSS > 0 {
			op = fmt.Sprintf("%.0f MiB", r.opRSS)
		}
		fmt.Printf("| %s | %s | %s | %s | %s | %s (local pods added by %s) | %.0f MiB | %.0f / %.0f / %.0f MiB | %s | %.1f%% | %s / %s / %s (%d) | %s / %s | %s / %s | %s |\n", r.mode, r.agent,
			ms(r.synced), ms(r.ipcache), ms(r.idents), ms(r.policy), ms(r.cniDone), r.rssMiB, r.mem.Anon, r.mem.File, r.mem.HWM, live, r.cpuPct,
			ms(r.newP50), ms(r.newP99), ms(r.newMax), r.newN, ms(r.ipcP50), ms(r.ipcP99), ms(r.floorP50), ms(r.floorP99), op)
	}
	if b.churnFor > 0 {
		fmt.Printf("\nUnder churn (%d pods/s created and as many deleted, %s):\n\n", b.churnRate, b.churnFor)
		fmt.Println("| identity mode | agent | create+delete pairs done (per s) | new remote pod in every selecting policy map p50 / p99 / max (n) | a plain watch saw it p50 / p99 | agent RSS at the end | agent CPU |")
		fmt.Println("|---|---|---|---|---|---|---|")
		for _, r := range rs {
			if r.err != "" {
				continue
			}
			fmt.Printf("| %s | %s | %d (%.1f/s) | %s / %s / %s (%d) | %s / %s | %.0f MiB | %.1f%% |\n", r.mode, r.agent, r.churnOps, r.churnAchieved,
				ms(r.churnP50), ms(r.churnP99), ms(r.churnMax), r.churnN, ms(r.churnFloorP50), ms(r.churnFloorP99), r.churnRSS, r.churnCPU)
		}
	}
	fmt.Printf("\nLoad after: %s\n", loadavg())
}
