// Command bgp measures the BGP control plane in a lab made with `tendril
// lab up --bgp` (bench/bgp/run.sh brings one up, runs this and takes it
// down), against the lab's real router, BIRD, read over its own control
// socket (what birdc speaks):
//
//   - Latency: LoadBalancer Services created one after the other (100 by
//     default), each asking LB-IPAM for a known address of a pool of the
//     benchmark's own (198.18.0.0/22, RFC 2544's benchmarking range) that
//     an advertisement of its own selects. For each: the time from the
//     address appearing in the Service's status (the benchmark's watch,
//     which sees it when the agents' watches do) to the /32 in BIRD's
//     table from the first node and from every node (BIRD's own time of
//     the route, to the millisecond: the lab's bird.conf asks for it),
//     and, in the same run, to the /32 in each agent's own loc-rib (GET
//     /v1/bgp/routes, as `tendril bgp routes`, read every 10 ms: gobgp
//     stamps paths to the second only), which splits the total into the
//     agent's part and BGP's propagation. The next Service is created once
//     BIRD has the last one from every node and a pause has passed, so
//     each is measured alone.
//   - Memory: each agent's RSS and live Go heap (after a forced GC, from
//     its pprof endpoint; run.sh starts the agents with
//     --pprof-serve-addr) with no Service (M0); with the Services grown to
//     1,000 and the advertisement taken away, so nothing of theirs is
//     announced (M1); and with the advertisement back, 1,000 prefixes
//     announced (M2). M2 - M1 is the speaker's share; M1 - M0 is the
//     Services themselves (caches, tables, the datapath's maps). It also
//     times the 1,000 routes reaching BIRD from every node after the
//     advertisement comes back, and checks BIRD has all 1,000 and each
//     node's status counts them.
//
// It prints Markdown-ready lines. Root (the agents' network namespaces).
package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/tendril-net/tendril/pkg/client"
	"github.com/tendril-net/tendril/pkg/controlplane"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	tendrilclient "github.com/tendril-net/tendril/pkg/k8s/client/clientset/versioned"
	"github.com/tendril-net/tendril/pkg/lab"
	"github.com/tendril-net/tendril/pkg/operator/lbipam"
)

const (
	namespace = "bgpbench"
	// benchName names the pool and the advertisement.
	benchName  = "bgpbench"
	benchLabel = "tendril.io/bgp-bench"
	// poolCIDR: 1,022 addresses, none the lab uses.
	poolCIDR = "198.18.0.0/22"
)

func main() {
	labName := flag.String("lab", "", "the lab (tendril lab up --bgp, agents with --pprof-serve-addr)")
	services := flag.Int("services", 100, "Services for the latency, created one at a time")
	total := flag.Int("total", 1000, "Services (announced prefixes) for the memory")
	pprofPort := flag.Int("pprof-port", 6060, "the agents' --pprof-serve-addr port on 127.0.0.1 of their namespace")
	birdPoll := flag.Duration("bird-poll", 5*time.Millisecond, "pause between two reads of BIRD's table")
	agentPoll := flag.Duration("agent-poll", 10*time.Millisecond, "pause between two reads of an agent's loc-rib")
	gap := flag.Duration("gap", 300*time.Millisecond, "pause after a Service's route is in BIRD before the next Service")
	flag.Parse()
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	if *labName == "" {
		log.Fatal("-lab is required")
	}
	if *total < *services {
		log.Fatal("-total must be at least -services")
	}
	b, err := setup(*labName, *pprofPort)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	defer b.cleanup(ctx)
	if err := b.run(ctx, *services, *total, *birdPoll, *agentPoll, *gap); err != nil {
		b.cleanup(ctx)
		log.Fatal(err)
	}
}

// bench is one run against one lab.
type bench struct {
	st        *lab.State
	cs        kubernetes.Interface
	tc        tendrilclient.Interface
	agents    map[string]*client.Client // by node
	pids      map[string]int            // agents' PIDs by node
	pprofPort int
	addrs     []netip.Addr // the Services' addresses, in creation order

	mu       sync.Mutex
	assigned map[netip.Addr]time.Time // the address first seen in a Service's status
}

func setup(name string, pprofPort int) (*bench, error) {
	st, err := lab.LoadState(name)
	if err != nil {
		return nil, err
	}
	if st.BGP == nil {
		return nil, fmt.Errorf("lab %s runs no BGP router (lab up --bgp)", name)
	}
	rc, err := controlplane.RESTConfig(st.Kubeconfig)
	if err != nil {
		return nil, err
	}
	rc.QPS, rc.Burst = 200, 400
	b := &bench{st: st, agents: map[string]*client.Client{}, pids: map[string]int{}, pprofPort: pprofPort,
		assigned: map[netip.Addr]time.Time{}}
	if b.cs, err = kubernetes.NewForConfig(rc); err != nil {
		return nil, err
	}
	if b.tc, err = tendrilclient.NewForConfig(rc); err != nil {
		return nil, err
	}
	procs, err := lab.ReadProcesses(st.PidDir())
	if err != nil {
		return nil, err
	}
	for _, n := range st.Nodes {
		if b.agents[n.Name], err = client.New("unix://" + n.Socket); err != nil {
			return nil, err
		}
		for _, p := range procs {
			if p.Role == "agent-"+n.Name && p.Alive() {
				b.pids[n.Name] = p.PID
			}
		}
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", b.pids[n.Name]))
		if err != nil || strings.TrimSpace(string(comm)) != "tendril-agent" {
			return nil, fmt.Errorf("the agent of %s: no tendril-agent process (pid %d, %q, %v)", n.Name, b.pids[n.Name], comm, err)
		}
	}
	return b, nil
}

func (b *bench) nodes() []string {
	var out []string
	for _, n := range b.st.Nodes {
		out = append(out, n.Name)
	}
	return out
}

func (b *bench) run(ctx context.Context, services, total int, birdPoll, agentPoll, gap time.Duration) error {
	fmt.Printf("# %s, %d CPUs, load %s, lab %s: %d nodes, BIRD at %s\n", time.Now().UTC().Format(time.RFC3339), runtime.NumCPU(),
		loadavg(), b.st.Name, len(b.st.Nodes), b.st.World.Gateway)
	br, err := dialBird(b.st.BGP.Socket)
	if err != nil {
		return err
	}
	defer br.Close()
	// Every session up and every pod CIDR in BIRD's table: the lab is ready.
	if err := waitFor(ctx, "every node's session and pod CIDR in BIRD", 2*time.Minute, func() (bool, error) {
		rt, err := br.routes()
		if err != nil {
			return false, err
		}
		pods := 0
		for p, from := range rt {
			if !inPool(p) && len(from) > 0 {
				pods++
			}
		}
		return pods >= len(b.st.Nodes), fmt.Errorf("%d pod CIDRs", pods)
	}); err != nil {
		return err
	}

	m0, err := b.memory(ctx)
	if err != nil {
		return err
	}
	if err := b.createObjects(ctx); err != nil {
		return err
	}
	stop := b.watchServices(ctx)
	defer stop()

	p := netip.MustParsePrefix(poolCIDR)
	for a := p.Addr().Next(); len(b.addrs) < total; a = a.Next() {
		if !p.Contains(a.Next()) {
			return fmt.Errorf("pool %s is too small for %d Services", poolCIDR, total)
		}
		b.addrs = append(b.addrs, a)
	}

	// Latency: one Service at a time.
	lat, err := b.latency(ctx, br, services, birdPoll, agentPoll, gap)
	if err != nil {
		return err
	}
	lat.print(services, len(b.st.Nodes))

	// Memory: the advertisement away, the Services grown to total, M1;
	// the advertisement back, every prefix announced, M2.
	start := time.Now()
	if err := b.tc.TendrilV1alpha1().TendrilBGPAdvertisements().Delete(ctx, benchName, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("delete the advertisement: %w", err)
	}
	if err := waitFor(ctx, "BIRD to lose every benchmark route", 2*time.Minute, func() (bool, error) {
		n, err := br.poolRoutes(b.nodes())
		return n.any == 0, errors.Join(err, fmt.Errorf("%d left", n.any))
	}); err != nil {
		return err
	}
	fmt.Printf("advertisement deleted → BIRD without the %d routes of %d nodes: %s\n", services, len(b.st.Nodes), ms(time.Since(start)))

	start = time.Now()
	if err := b.createServices(ctx, services, total); err != nil {
		return err
	}
	if err := waitFor(ctx, fmt.Sprintf("LB-IPAM to give all %d addresses", total), 5*time.Minute, func() (bool, error) {
		n := b.assignedCount()
		return n == total, fmt.Errorf("%d given", n)
	}); err != nil {
		return err
	}
	fmt.Printf("%d more Services created and given addresses in %s\n", total-services, ms(time.Since(start)))
	// The agents take the Services into their tables (and the datapath's
	// maps); give them time to settle before measuring.
	time.Sleep(10 * time.Second)
	m1, err := b.memory(ctx)
	if err != nil {
		return err
	}

	start = time.Now()
	if err := b.createAdvertisement(ctx); err != nil {
		return err
	}
	var first time.Duration
	if err := waitFor(ctx, fmt.Sprintf("BIRD to have all %d routes from every node", total), 5*time.Minute, func() (bool, error) {
		n, err := br.poolRoutes(b.nodes())
		if n.any > 0 && first == 0 {
			first = time.Since(start)
		}
		return n.all == total, errors.Join(err, fmt.Errorf("%d from every node, %d from some", n.all, n.any))
	}); err != nil {
		return err
	}
	fmt.Printf("advertisement created → first route in BIRD %s, all %d from every node %s\n", ms(first), total, ms(time.Since(start)))
	if err := b.checkStatus(ctx, total); err != nil {
		return err
	}
	time.Sleep(6 * time.Second) // a refresh of the control plane (5 s) after the burst
	m2, err := b.memory(ctx)
	if err != nil {
		return err
	}
	n, err := br.poolRoutes(b.nodes())
	if err != nil {
		return err
	}
	fmt.Printf("BIRD's table: %d of the %d benchmark /32s from every node (%d paths)\n", n.all, total, n.paths)
	printMemory(b.nodes(), total, m0, m1, m2)
	fmt.Printf("# done %s, load %s\n", time.Now().UTC().Format(time.RFC3339), loadavg())
	return nil
}

// createObjects makes the namespace, the pool and the advertisement
// (selected by the lab's cluster config, whose advertisementSelector is
// tendril.io/lab=bgp).
func (b *bench) createObjects(ctx context.Context) error {
	if _, err := b.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", namespace, err)
	}
	pool := &v1alpha1.TendrilLoadBalancerIPPool{ObjectMeta: metav1.ObjectMeta{Name: benchName},
		Spec: v1alpha1.LoadBalancerIPPoolSpec{Blocks: []v1alpha1.LoadBalancerIPBlock{{CIDR: poolCIDR}},
			ServiceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{benchLabel: "true"}}}}
	if _, err := b.tc.TendrilV1alpha1().TendrilLoadBalancerIPPools().Create(ctx, pool, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create TendrilLoadBalancerIPPool %s: %w", benchName, err)
	}
	return b.createAdvertisement(ctx)
}

func (b *bench) createAdvertisement(ctx context.Context) error {
	adv := &v1alpha1.TendrilBGPAdvertisement{
		ObjectMeta: metav1.ObjectMeta{Name: benchName, Labels: map[string]string{"tendril.io/lab": "bgp"}},
		Spec: v1alpha1.BGPAdvertisementSpec{Advertisements: []v1alpha1.BGPAdvertisementEntry{{
			AdvertisementType: v1alpha1.BGPAdvertService,
			Service: &v1alpha1.BGPServiceAdvertisement{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{benchLabel: "true"}},
				Addresses: []string{v1alpha1.BGPServiceAddressLoadBalancerIP}},
		}}}}
	if _, err := b.tc.TendrilV1alpha1().TendrilBGPAdvertisements().Create(ctx, adv, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create TendrilBGPAdvertisement %s: %w", benchName, err)
	}
	return nil
}

func (b *bench) cleanup(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	_ = b.tc.TendrilV1alpha1().TendrilBGPAdvertisements().Delete(ctx, benchName, metav1.DeleteOptions{})
	_ = b.cs.CoreV1().Namespaces().Delete(ctx, namespace, metav1.DeleteOptions{})
	_ = b.tc.TendrilV1alpha1().TendrilLoadBalancerIPPools().Delete(ctx, benchName, metav1.DeleteOptions{})
}

func (b *bench) service(i int) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("lb-%04d", i), Namespace: namespace,
			Labels:      map[string]string{benchLabel: "true"},
			Annotations: map[string]string{lbipam.AnnotationIPs: b.addrs[i].String()}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer,
			Ports: []corev1.ServicePort{{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(80)}}},
	}
}

// createServices creates Services [from, to) with a few writers at once.
func (b *bench) createServices(ctx context.Context, from, to int) error {
	next := make(chan int)
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range next {
				if _, err := b.cs.CoreV1().Services(namespace).Create(ctx, b.service(i), metav1.CreateOptions{}); err != nil {
					select {
					case errs <- fmt.Errorf("create Service %d: %w", i, err):
					default:
					}
				}
			}
		})
	}
	for i := from; i < to; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// watchServices records when each address first shows in a Service's
// status.
func (b *bench) watchServices(ctx context.Context) func() {
	f := informers.NewSharedInformerFactoryWithOptions(b.cs, 0, informers.WithNamespace(namespace))
	inf := f.Core().V1().Services().Informer()
	seen := func(obj any) {
		now := time.Now()
		svc, ok := obj.(*corev1.Service)
		if !ok {
			return
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, in := range svc.Status.LoadBalancer.Ingress {
			if a, err := netip.ParseAddr(in.IP); err == nil {
				if _, ok := b.assigned[a]; !ok {
					b.assigned[a] = now
				}
			}
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: seen, UpdateFunc: func(_, o any) { seen(o) }})
	stopCh := make(chan struct{})
	f.Start(stopCh)
	f.WaitForCacheSync(stopCh)
	return func() { close(stopCh); f.Shutdown() }
}

func (b *bench) assignedAt(a netip.Addr) (time.Time, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	t, ok := b.assigned[a]
	return t, ok
}

func (b *bench) assignedCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.assigned)
}

// firstSeen records, per prefix and node, when a poller first saw it.
type firstSeen struct {
	mu sync.Mutex
	at map[netip.Prefix]map[string]time.Time
}

func (f *firstSeen) saw(p netip.Prefix, node string, t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.at[p] == nil {
		f.at[p] = map[string]time.Time{}
	}
	if _, ok := f.at[p][node]; !ok {
		f.at[p][node] = t
	}
}

// of returns node's time of p (zero: not seen).
func (f *firstSeen) of(p netip.Prefix, node string) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.at[p][node]
}

// get returns the first and the last node's time, and how many nodes.
func (f *firstSeen) get(p netip.Prefix) (first, last time.Time, nodes int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, t := range f.at[p] {
		if first.IsZero() || t.Before(first) {
			first = t
		}
		if t.After(last) {
			last = t
		}
	}
	return first, last, len(f.at[p])
}

type latencies struct {
	created, birdFirst, birdAll, agentFirst, agentAll, createdBird []time.Duration
	// propagation: a node's path in its loc-rib → in BIRD, per node.
	propagation []time.Duration
	// birdReads and agentReads are the reads' durations.
	birdReads, agentReads []time.Duration
	// agentWindows: from one read's start to the next one's end.
	agentWindows        []time.Duration
	birdPoll, agentPoll time.Duration
	// birdUntimed counts routes BIRD printed without a time.
	birdUntimed int
}

// latency creates Services [0, n) one at a time; pollers read BIRD's
// table and every agent's loc-rib meanwhile.
func (b *bench) latency(ctx context.Context, br *bird, n int, birdPoll, agentPoll, gap time.Duration) (*latencies, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	birdSeen := &firstSeen{at: map[netip.Prefix]map[string]time.Time{}}
	agentSeen := &firstSeen{at: map[netip.Prefix]map[string]time.Time{}}
	out := &latencies{birdPoll: birdPoll, agentPoll: agentPoll}
	var wg sync.WaitGroup
	var pollErr error
	var errMu sync.Mutex
	fail := func(err error) {
		errMu.Lock()
		defer errMu.Unlock()
		pollErr = cmp.Or(pollErr, err)
		cancel()
	}
	// BIRD's own time of each route when it prints one (the lab's
	// bird.conf asks for milliseconds), else the end of the read that
	// first showed it.
	wg.Go(func() {
		for ctx.Err() == nil {
			start := time.Now()
			rt, err := br.routes()
			now := time.Now()
			if err != nil {
				fail(err)
				return
			}
			out.birdReads = append(out.birdReads, now.Sub(start))
			for p, from := range rt {
				if inPool(p) {
					for node, at := range from {
						if at.IsZero() {
							out.birdUntimed++
							at = now
						}
						birdSeen.saw(p, node, at)
					}
				}
			}
			sleep(ctx, birdPoll)
		}
	})
	// gobgp stamps a path only to the second (its age), so an agent's
	// time is the poll's: a path first shown by a read entered the loc-rib
	// after the previous read began and before this one ended; the
	// midpoint of the two is its time (± half of that, reported).
	reads := make([][]time.Duration, len(b.st.Nodes))
	windows := make([][]time.Duration, len(b.st.Nodes))
	for i, node := range b.nodes() {
		c := b.agents[node]
		q := url.Values{"table_type": {"loc-rib"}, "afi": {"ipv4"}, "safi": {"unicast"}}
		wg.Go(func() {
			var prev time.Time
			for ctx.Err() == nil {
				var routes []*models.BgpRoute
				start := time.Now()
				err := c.Do(ctx, "GET", "/bgp/routes", q, nil, nil, &routes)
				now := time.Now()
				if err != nil {
					if ctx.Err() == nil {
						fail(fmt.Errorf("GET /v1/bgp/routes of %s: %w", node, err))
					}
					return
				}
				reads[i] = append(reads[i], now.Sub(start))
				at := now
				if !prev.IsZero() {
					at = prev.Add(now.Sub(prev) / 2)
					windows[i] = append(windows[i], now.Sub(prev))
				}
				for _, r := range routes {
					if p, err := netip.ParsePrefix(r.Prefix); err == nil && inPool(p) && len(r.Paths) > 0 {
						agentSeen.saw(p, node, at)
					}
				}
				prev = start
				sleep(ctx, agentPoll)
			}
		})
	}
	nodes := len(b.st.Nodes)
	for i := range n {
		a := b.addrs[i]
		p := netip.PrefixFrom(a, 32)
		created := time.Now()
		if _, err := b.cs.CoreV1().Services(namespace).Create(ctx, b.service(i), metav1.CreateOptions{}); err != nil {
			cancel()
			wg.Wait()
			return nil, cmp.Or(pollErr, fmt.Errorf("create Service %d: %w", i, err))
		}
		err := waitFor(ctx, fmt.Sprintf("%s in BIRD from every node and in every agent's loc-rib", p), time.Minute, func() (bool, error) {
			_, _, bn := birdSeen.get(p)
			_, _, an := agentSeen.get(p)
			_, ok := b.assignedAt(a)
			return bn == nodes && an == nodes && ok, fmt.Errorf("BIRD from %d nodes, agents %d, address given %v", bn, an, ok)
		})
		if err != nil {
			cancel()
			wg.Wait()
			return nil, cmp.Or(pollErr, err)
		}
		given, _ := b.assignedAt(a)
		bf, bl, _ := birdSeen.get(p)
		af, al, _ := agentSeen.get(p)
		out.created = append(out.created, given.Sub(created))
		out.birdFirst = append(out.birdFirst, bf.Sub(given))
		out.birdAll = append(out.birdAll, bl.Sub(given))
		out.agentFirst = append(out.agentFirst, af.Sub(given))
		out.agentAll = append(out.agentAll, al.Sub(given))
		out.createdBird = append(out.createdBird, bl.Sub(created))
		for _, node := range b.nodes() {
			out.propagation = append(out.propagation, birdSeen.of(p, node).Sub(agentSeen.of(p, node)))
		}
		sleep(ctx, gap)
	}
	cancel()
	wg.Wait()
	for i, r := range reads {
		out.agentReads = append(out.agentReads, r...)
		out.agentWindows = append(out.agentWindows, windows[i]...)
	}
	return out, nil
}

func (l *latencies) print(n, nodes int) {
	fmt.Printf("latency over %d Services created one at a time, %d nodes: a route's time in BIRD is BIRD's own stamp (ms; %d routes unstamped took the read's end),\n",
		n, nodes, l.birdUntimed)
	fmt.Printf("  a path's in an agent's loc-rib the middle of the reads around it (GET /v1/bgp/routes every %s; window p50 %s, p99 %s: ± half)\n",
		l.agentPoll, ms(pct(l.agentWindows, 50)), ms(pct(l.agentWindows, 99)))
	fmt.Printf("  (reads: BIRD's table %d, every %s, each p50 %s p99 %s; the agents' loc-rib %d, each p50 %s p99 %s)\n",
		len(l.birdReads), l.birdPoll, ms(pct(l.birdReads, 50)), ms(pct(l.birdReads, 99)),
		len(l.agentReads), ms(pct(l.agentReads, 50)), ms(pct(l.agentReads, 99)))
	row := func(what string, d []time.Duration) {
		fmt.Printf("  %-62s p50 %7s  p99 %7s  max %7s  min %7s\n", what, ms(pct(d, 50)), ms(pct(d, 99)), ms(pct(d, 100)), ms(pct(d, 0)))
	}
	row("Service created → address in its status (LB-IPAM)", l.created)
	row("address in status → in the agents' loc-rib, first node", l.agentFirst)
	row("address in status → in the agents' loc-rib, every node", l.agentAll)
	row("address in status → route in BIRD, first node's path", l.birdFirst)
	row("address in status → route in BIRD, every node's path", l.birdAll)
	row("a node's loc-rib → its path in BIRD (BGP's part; per node and Service)", l.propagation)
	row("Service created → route in BIRD, every node's path", l.createdBird)
}

// pct is the nearest-rank percentile (0: the minimum, 100: the maximum).
func pct(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

// checkStatus: every node's entry of the lab's cluster config counts the
// total Services' prefixes and its pod CIDR.
func (b *bench) checkStatus(ctx context.Context, total int) error {
	return waitFor(ctx, "every node's status to count the prefixes", time.Minute, func() (bool, error) {
		cc, err := b.tc.TendrilV1alpha1().TendrilBGPClusterConfigs().Get(ctx, lab.BGPConfigName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		var counts []string
		ok := len(cc.Status.Nodes) == len(b.st.Nodes)
		for _, n := range cc.Status.Nodes {
			counts = append(counts, fmt.Sprintf("%s %d", n.Node, n.Advertised))
			ok = ok && n.Advertised == total+1
		}
		if ok {
			fmt.Printf("the nodes' status: %s announced (the Services' %d and the pod CIDR)\n", strings.Join(counts, ", "), total)
		}
		return ok, fmt.Errorf("announced: %s", strings.Join(counts, ", "))
	})
}

// mem is one agent's memory.
type mem struct {
	rss       uint64 // VmRSS
	heapAlloc uint64 // live heap after a forced GC
	heapSys   uint64 // heap obtained from the OS
	sys       uint64 // everything the Go runtime obtained
}

// memory reads every agent's: RSS from /proc, the heap from pprof's heap
// profile with gc=1 (a GC first), the smallest of three reads.
func (b *bench) memory(ctx context.Context) (map[string]mem, error) {
	out := map[string]mem{}
	for _, n := range b.st.Nodes {
		var best mem
		for i := range 3 {
			if i > 0 {
				time.Sleep(time.Second)
			}
			m, err := b.agentMemory(ctx, n)
			if err != nil {
				return nil, err
			}
			if i == 0 || m.heapAlloc < best.heapAlloc {
				best = m
			}
		}
		out[n.Name] = best
	}
	return out, nil
}

func (b *bench) agentMemory(ctx context.Context, n lab.Node) (mem, error) {
	var m mem
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", b.pids[n.Name]))
	if err != nil {
		return m, fmt.Errorf("the agent of %s: %w", n.Name, err)
	}
	for l := range strings.Lines(string(status)) {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return m, fmt.Errorf("VmRSS of %s: %w", n.Name, err)
			}
			m.rss = kb << 10
		}
	}
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return dialIn(lab.NetnsPath(n.Netns), network, addr)
		}}}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/heap?gc=1&debug=1", b.pprofPort), nil)
	if err != nil {
		return m, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return m, fmt.Errorf("pprof of %s (agent started with --pprof-serve-addr=127.0.0.1:%d?): %w", n.Name, b.pprofPort, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return m, fmt.Errorf("pprof of %s: %s", n.Name, resp.Status)
	}
	found := 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		for name, dst := range map[string]*uint64{"HeapAlloc": &m.heapAlloc, "HeapSys": &m.heapSys, "Sys": &m.sys} {
			if v, ok := strings.CutPrefix(sc.Text(), "# "+name+" = "); ok {
				if *dst, err = strconv.ParseUint(v, 10, 64); err != nil {
					return m, fmt.Errorf("pprof of %s: %s: %w", n.Name, name, err)
				}
				found++
			}
		}
	}
	if err := sc.Err(); err != nil {
		return m, err
	}
	if found != 3 {
		return m, fmt.Errorf("pprof of %s: no runtime.MemStats in the heap profile", n.Name)
	}
	return m, nil
}

// dialIn opens a connection from inside the network namespace at path:
// a socket belongs to the namespace its thread was in when it was made.
func dialIn(path, network, addr string) (net.Conn, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return nil, err
	}
	defer orig.Close()
	target, err := netns.GetFromPath(path)
	if err != nil {
		return nil, err
	}
	defer target.Close()
	if err := netns.Set(target); err != nil {
		return nil, err
	}
	conn, dialErr := net.DialTimeout(network, addr, 5*time.Second)
	if err := netns.Set(orig); err != nil {
		// The thread is in the wrong namespace: let it die with the
		// goroutine (no UnlockOSThread) rather than serve others.
		panic(fmt.Sprintf("back to the original network namespace: %v", err))
	}
	return conn, dialErr
}

func printMemory(nodes []string, total int, m0, m1, m2 map[string]mem) {
	mib := func(v uint64) string { return fmt.Sprintf("%.1f", float64(v)/(1<<20)) }
	dmib := func(a, b uint64) string { return fmt.Sprintf("%+.1f", (float64(a)-float64(b))/(1<<20)) }
	fmt.Printf("agent memory, MiB (live heap after a forced GC; RSS): M0 no Service, M1 %d Services not announced, M2 the %d announced\n", total, total)
	fmt.Println("| node | heap M0 | heap M1 | heap M2 | speaker's heap M2−M1 (per prefix) | RSS M0 | RSS M1 | RSS M2 | RSS M2−M1 | Go runtime Sys M1 → M2 |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|")
	for _, n := range nodes {
		a, b, c := m0[n], m1[n], m2[n]
		per := (float64(c.heapAlloc) - float64(b.heapAlloc)) / float64(total)
		fmt.Printf("| %s | %s | %s | %s | %s (%.2f KiB) | %s | %s | %s | %s | %s → %s |\n", n, mib(a.heapAlloc), mib(b.heapAlloc), mib(c.heapAlloc),
			dmib(c.heapAlloc, b.heapAlloc), per/1024, mib(a.rss), mib(b.rss), mib(c.rss), dmib(c.rss, b.rss), mib(b.sys), mib(c.sys))
	}
}

func inPool(p netip.Prefix) bool {
	return p.Bits() == 32 && netip.MustParsePrefix(poolCIDR).Contains(p.Addr())
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// waitFor polls cond every 2 ms until it holds, for at most timeout.
func waitFor(ctx context.Context, what string, timeout time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("waiting for %s: %w", what, cmp.Or(ctx.Err(), err, errors.New("timed out")))
		}
		sleep(ctx, 2*time.Millisecond)
	}
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:3], " ")
}

// bird is a client of BIRD's control socket (birdc's protocol: each reply
// line starts with a four-digit code and '-' when more follows, ' ' on
// the last; a line starting with a space continues the previous code).
type bird struct {
	conn net.Conn
	r    *bufio.Reader
}

func dialBird(socket string) (*bird, error) {
	conn, err := net.Dial("unix", socket)
	if err != nil {
		return nil, fmt.Errorf("BIRD's control socket: %w", err)
	}
	b := &bird{conn: conn, r: bufio.NewReaderSize(conn, 1<<20)}
	if _, err := b.reply(); err != nil { // the greeting
		conn.Close()
		return nil, err
	}
	return b, nil
}

func (b *bird) Close() error { return b.conn.Close() }

func (b *bird) cmd(c string) ([]string, error) {
	if _, err := io.WriteString(b.conn, c+"\n"); err != nil {
		return nil, fmt.Errorf("birdc %s: %w", c, err)
	}
	lines, err := b.reply()
	if err != nil {
		return nil, fmt.Errorf("birdc %s: %w", c, err)
	}
	return lines, nil
}

func (b *bird) reply() ([]string, error) {
	var out []string
	for {
		line, err := b.r.ReadString('\n')
		if err != nil {
			return nil, err
		}
		line = strings.TrimSuffix(line, "\n")
		if len(line) >= 5 && isCode(line[:4]) {
			out = append(out, line[5:])
			if line[4] == ' ' {
				if line[0] == '8' || line[0] == '9' {
					return out, errors.New(line[5:])
				}
				return out, nil
			}
			continue
		}
		out = append(out, strings.TrimPrefix(line, " "))
	}
}

func isCode(s string) bool {
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// routes is BIRD's table: each prefix, the protocols (the lab names each
// node's session after the node) it has a route from, and when BIRD took
// each route in (the lab's bird.conf prints it to the millisecond; zero
// when it does not).
func (b *bird) routes() (map[netip.Prefix]map[string]time.Time, error) {
	lines, err := b.cmd("show route")
	if err != nil {
		return nil, err
	}
	out := map[netip.Prefix]map[string]time.Time{}
	var cur netip.Prefix
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		if l[0] != ' ' && l[0] != '\t' {
			p, err := netip.ParsePrefix(f[0])
			if err != nil {
				continue // "Table master4:"
			}
			cur = p
		}
		// "198.18.0.1/32  unicast [node1 2026-11-29 13:44:42.826] * (100) [AS65001i]"
		if i := slices.Index(f, "unicast"); i >= 0 && i+1 < len(f) && strings.HasPrefix(f[i+1], "[") && cur.IsValid() {
			if out[cur] == nil {
				out[cur] = map[string]time.Time{}
			}
			var at time.Time
			if i+3 < len(f) {
				at, _ = time.ParseInLocation("2006-01-02 15:04:05.000", f[i+2]+" "+strings.TrimSuffix(f[i+3], "]"), time.Local)
			}
			out[cur][strings.TrimPrefix(f[i+1], "[")] = at
		}
	}
	return out, nil
}

type poolCount struct{ any, all, paths int }

// poolRoutes counts the benchmark's /32s in BIRD's table: from any node,
// from every node of nodes, and their paths.
func (b *bird) poolRoutes(nodes []string) (poolCount, error) {
	var n poolCount
	rt, err := b.routes()
	if err != nil {
		return n, err
	}
	for p, from := range rt {
		if !inPool(p) || len(from) == 0 {
			continue
		}
		n.any++
		n.paths += len(from)
		if !slices.ContainsFunc(nodes, func(node string) bool { _, ok := from[node]; return !ok }) {
			n.all++
		}
	}
	return n, nil
}
