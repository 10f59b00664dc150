// Command flows measures what flow observability costs the datapath, in
// network namespaces it creates and removes (pkg/testutil/netlab: a node
// and two pods wired as tendril-cni wires them). Two datapaths are loaded,
// each under its own BPF root, and the pods' endpoints alternate between
// them within each round:
//
//   - off: no trace events, no policy verdict events (drops would still be
//     reported: there are none here), the ring buffer read as the agent
//     always reads it;
//   - on: what the agent runs with flows on: per-connection trace events
//     and policy verdict events, read from the ring buffer and decoded by
//     the observer into its ring with every flow metric, on the same two
//     cores.
//
// Workloads: TCP throughput (iperf3, one stream) and the rate of new TCP
// connections (a Go client in pod a connecting to and closing on a Go
// server in pod b as fast as it can, each connection SYN, SYN-ACK, FIN and
// RST: about eight events with flows on). It prints Markdown rows for
// docs/benchmarks.md: medians and on/off ratios of the same run.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/hubble/flowmetrics"
	"github.com/tendril-net/tendril/pkg/observer"
	"github.com/tendril-net/tendril/pkg/testutil/netlab"
)

const (
	iperfPort = 5299
	connPort  = 8080
)

type options struct {
	duration time.Duration
	rounds   int
	// loadOrder is the order the two datapaths are loaded in.
	loadOrder []string
}

func main() {
	var o options
	flag.DurationVar(&o.duration, "duration", 6*time.Second, "length of each measurement")
	flag.IntVar(&o.rounds, "rounds", 3, "rounds; each measures both modes, in alternating order")
	reverse := flag.Bool("load-on-first", false, "load the flows-on datapath first (diagnosis: the order must not matter)")
	flag.Parse()
	o.loadOrder = []string{"off", "on"}
	if *reverse {
		o.loadOrder = []string{"on", "off"}
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench/flows needs root")
		os.Exit(1)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bench/flows:", err)
		os.Exit(1)
	}
}

// datapath is one loaded datapath and, with flows on, its observer.
type datapath struct {
	l        *loader.Loader
	flows    bool
	obs      *observer.Observer
	reader   *loader.EventReader
	readDone chan struct{}
}

type bench struct {
	o        options
	node     *netlab.Node
	a, b     *netlab.Pod
	idA, idB uint32
	modes    map[string]*datapath
	active   *datapath
}

func run(o options) error {
	node, err := netlab.NewNode("tdrflowb")
	if err != nil {
		return err
	}
	defer node.Close()
	b := &bench{o: o, node: node, idA: 5001, idB: 5002, modes: map[string]*datapath{}}
	if b.a, err = node.AddPod("a", 0); err != nil {
		return err
	}
	if b.b, err = node.AddPod("b", 1); err != nil {
		return err
	}
	leave, err := node.Enter()
	if err != nil {
		return err
	}
	defer leave()
	for _, mode := range o.loadOrder {
		root := filepath.Join("/sys/fs/bpf", node.Name+"-"+mode)
		defer os.RemoveAll(root)
		cfg := loader.Config{BPFRoot: root, DirectDelivery: true}
		if mode == "on" {
			cfg.TraceEvents, cfg.PolicyVerdictEvents = loader.TracePerConnection, true
		}
		dp := &datapath{l: loader.New(cfg, nil), flows: mode == "on"}
		if err := dp.l.Start(); err != nil {
			return fmt.Errorf("start the %s datapath: %w", mode, err)
		}
		defer dp.l.Close()
		if err := b.load(dp.l); err != nil {
			return err
		}
		if dp.flows {
			m, err := flowmetrics.New(flowmetrics.Config{Metrics: flowmetrics.All}, prometheus.NewRegistry())
			if err != nil {
				return err
			}
			dp.obs = observer.New(observer.Config{Consumers: []func(*flowpb.Flow){m.Observe}}, b.knowledge(), nil)
		}
		b.modes[mode] = dp
	}
	defer b.detach()

	srv, err := b.connServer()
	if err != nil {
		return err
	}
	defer srv.Close()

	gbit := map[string][]float64{}
	conns := map[string][]float64{}
	seen := map[string]uint64{}
	for r := range o.rounds {
		for i := range 2 {
			mode := []string{"off", "on"}[(i+r)%2]
			if err := b.use(mode); err != nil {
				return err
			}
			g, err := b.iperf()
			if err != nil {
				return err
			}
			c, err := b.connRate()
			if err != nil {
				return err
			}
			gbit[mode] = append(gbit[mode], g)
			conns[mode] = append(conns[mode], c)
			fmt.Fprintf(os.Stderr, "round %d %s: %.2f Gbit/s, %.0f connections/s\n", r+1, mode, g, c)
		}
	}
	if err := b.use(""); err != nil {
		return err
	}
	on := b.modes["on"]
	seen["on"] = on.obs.Ring().Seen()
	lost, err := on.l.EventsLost()
	if err != nil {
		return err
	}

	date := time.Now().UTC().Format("2006-01-02 15:04")
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("| date (UTC) | workload | flows off (median of %d) | flows on | on/off |\n|---|---|---|---|---|\n", o.rounds)
	fmt.Printf("| %s | TCP throughput, Gbit/s | %.2f | %.2f | %.1f%% |\n", date, median(gbit["off"]), median(gbit["on"]), 100*median(gbit["on"])/median(gbit["off"]))
	fmt.Printf("| %s | new TCP connections/s | %.0f | %.0f | %.1f%% |\n", date, median(conns["off"]), median(conns["on"]), 100*median(conns["on"])/median(conns["off"]))
	// The machine's load moves between rounds more than flows do: the
	// ratio of each round's pair (measured back to back) is the steadier
	// number.
	pairs := func(v map[string][]float64) []float64 {
		out := make([]float64, len(v["on"]))
		for i := range out {
			out[i] = 100 * v["on"][i] / v["off"][i]
		}
		return out
	}
	fmt.Printf("\nOn/off per round (%%): throughput %s (median %.1f%%), connections %s (median %.1f%%).\n",
		list(pairs(gbit)), median(pairs(gbit)), list(pairs(conns)), median(pairs(conns)))
	fmt.Printf("\nRounds: Gbit/s off %s, on %s; connections/s off %s, on %s.\n", list(gbit["off"]), list(gbit["on"]), list(conns["off"]), list(conns["on"]))
	fmt.Printf("Flows on: %d flows decoded; events lost: %d ring full, %d over the rate limit.\n", seen["on"], lost.RingFull, lost.RateLimited)
	fmt.Printf("Load average at the end: %s", load)
	return nil
}

// load writes the pods' identities and rules: a may open TCP to b on the
// two ports, b accepts them from a; both enforce both directions.
func (b *bench) load(l *loader.Loader) error {
	m := l.Maps()
	for _, p := range []struct {
		pod *netlab.Pod
		id  uint32
	}{{b.a, b.idA}, {b.b, b.idB}} {
		for _, ip := range []netip.Addr{p.pod.IPv4, p.pod.IPv6} {
			if err := m.IPCacheMap().Upsert(netip.PrefixFrom(ip, ip.BitLen()), maps.IPCacheEntry{Identity: p.id}); err != nil {
				return err
			}
		}
	}
	for _, port := range []uint16{iperfPort, connPort} {
		if err := m.PolicyMap().Upsert(maps.PolicyKey{EndpointID: 1, Direction: maps.DirEgress, Identity: b.idB, Proto: 6, Port: port, PortPrefixLen: 16}, maps.PolicyValue{Cookie: 1}); err != nil {
			return err
		}
		if err := m.PolicyMap().Upsert(maps.PolicyKey{EndpointID: 2, Direction: maps.DirIngress, Identity: b.idA, Proto: 6, Port: port, PortPrefixLen: 16}, maps.PolicyValue{Cookie: 2}); err != nil {
			return err
		}
	}
	return nil
}

func (b *bench) endpoint(p *netlab.Pod, id uint16, identity uint32) loader.EndpointInfo {
	return loader.EndpointInfo{ID: id, IfIndex: p.HostIfIndex, IfName: p.HostIf, Addresses: []netip.Addr{p.IPv4, p.IPv6},
		Identity: identity, EnforceIngress: true, EnforceEgress: true, MAC: p.MAC, HostMAC: p.HostMAC}
}

// use moves both endpoints to the mode's datapath ("": none) and, with
// flows on, starts reading its events into the observer.
func (b *bench) use(mode string) error {
	if cur := b.active; cur != nil {
		for _, id := range []uint16{1, 2} {
			if err := cur.l.DetachEndpoint(id, nil); err != nil {
				return err
			}
		}
		if cur.reader != nil {
			_ = cur.reader.Close()
			<-cur.readDone
			cur.reader = nil
		}
		b.active = nil
	}
	if mode == "" {
		return nil
	}
	dp := b.modes[mode]
	// The agent reads the ring buffer whether flows are on or not (it
	// counts drops): both modes run the reader, only "on" decodes.
	er, err := dp.l.NewEventReader()
	if err != nil {
		return err
	}
	dp.reader, dp.readDone = er, make(chan struct{})
	go func() {
		defer close(dp.readDone)
		for {
			ev, err := er.Read()
			if err != nil {
				return // closed
			}
			if dp.obs != nil {
				_ = dp.obs.Observe(ev)
			}
		}
	}()
	if err := dp.l.AttachEndpoint(b.endpoint(b.a, 1, b.idA)); err != nil {
		return err
	}
	if err := dp.l.AttachEndpoint(b.endpoint(b.b, 2, b.idB)); err != nil {
		return err
	}
	b.active = dp
	return nil
}

func (b *bench) detach() { _ = b.use("") }

// iperf runs one TCP stream from a to b for the run length: Gbit/s.
func (b *bench) iperf() (float64, error) {
	srv := b.b.Command("iperf3", "-s", "-1", "-p", fmt.Sprint(iperfPort))
	if err := srv.Start(); err != nil {
		return 0, fmt.Errorf("start iperf3 server: %w", err)
	}
	defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	args := []string{"-c", b.b.IPv4.String(), "-p", fmt.Sprint(iperfPort), "-t", fmt.Sprint(int(b.o.duration.Seconds())), "-J"}
	for try := 0; ; try++ {
		out, err := b.a.Command("iperf3", args...).Output()
		var res struct {
			Error string `json:"error"`
			End   struct {
				SumReceived struct {
					BitsPerSecond float64 `json:"bits_per_second"`
				} `json:"sum_received"`
			} `json:"end"`
		}
		if err == nil {
			err = json.Unmarshal(out, &res)
		}
		if err == nil && res.Error != "" {
			err = errors.New(res.Error)
		}
		if err == nil {
			return res.End.SumReceived.BitsPerSecond / 1e9, nil
		}
		if try == 50 { // the server needs a moment to listen
			return 0, fmt.Errorf("iperf3: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// connServer accepts connections in b and closes them at once.
func (b *bench) connServer() (net.Listener, error) {
	var ln net.Listener
	err := b.b.Do(func() (err error) {
		ln, err = net.Listen("tcp", netip.AddrPortFrom(b.b.IPv4, connPort).String())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen in b: %w", err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return ln, nil
}

// connRate connects from a to b and closes, one connection after the
// other, for the run length: connections per second. Each closes with
// SO_LINGER 0 (an RST), so the client's ports are not held in TIME_WAIT.
func (b *bench) connRate() (float64, error) {
	var n int
	var elapsed time.Duration
	addr := netip.AddrPortFrom(b.b.IPv4, connPort).String()
	err := b.a.Do(func() error {
		start := time.Now()
		for time.Since(start) < b.o.duration {
			c, err := net.DialTimeout("tcp", addr, 2*time.Second)
			if err != nil {
				return fmt.Errorf("connect %d: %w", n, err)
			}
			_ = c.(*net.TCPConn).SetLinger(0)
			c.Close()
			n++
		}
		elapsed = time.Since(start)
		return nil
	})
	if err != nil {
		return 0, err
	}
	return float64(n) / elapsed.Seconds(), nil
}

// knowledge names the two pods, as the agent's node knowledge would.
func (b *bench) knowledge() observer.NodeKnowledge {
	return &podsKnowledge{eps: map[netip.Addr]observer.Endpoint{
		b.a.IPv4: {ID: 1, Identity: b.idA, Namespace: "bench", PodName: "a", Labels: []string{"k8s:app=a"}},
		b.b.IPv4: {ID: 2, Identity: b.idB, Namespace: "bench", PodName: "b", Labels: []string{"k8s:app=b"}},
	}}
}

type podsKnowledge struct {
	mu  sync.Mutex
	eps map[netip.Addr]observer.Endpoint
}

func (k *podsKnowledge) NodeName() string               { return "bench" }
func (k *podsKnowledge) IdentityLabels(uint32) []string { return nil }
func (k *podsKnowledge) PolicyByCookie(c uint32) (observer.Policy, bool) {
	return observer.Policy{Namespace: "bench", Name: fmt.Sprintf("rule-%d", c)}, true
}
func (k *podsKnowledge) EndpointByID(id uint16) (observer.Endpoint, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, e := range k.eps {
		if e.ID == uint32(id) {
			return e, true
		}
	}
	return observer.Endpoint{}, false
}
func (k *podsKnowledge) EndpointByIP(ip netip.Addr) (observer.Endpoint, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	e, ok := k.eps[ip]
	return e, ok
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

func list(v []float64) string {
	out := make([]string, len(v))
	for i, x := range v {
		out[i] = fmt.Sprintf("%.2f", x)
		if x > 100 {
			out[i] = fmt.Sprintf("%.0f", x)
		}
	}
	return strings.Join(out, ", ")
}
