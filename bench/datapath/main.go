// Command datapath measures Tendril's eBPF datapath on this machine, in
// network namespaces it creates and removes: TCP throughput pod to pod
// through the programs against bare veth routing with no program (same run,
// alternating), with 10,000 policy entries and 100,000 conntrack entries
// loaded; and the programs' per-packet cost from the kernel's BPF run-time
// statistics, plus BPF_PROG_TEST_RUN timings of the forward (established)
// and the policy + conntrack-create paths. It prints a Markdown report.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

var (
	duration = flag.Duration("duration", 8*time.Second, "iperf3 run length")
	rounds   = flag.Int("rounds", 3, "alternating rounds of baseline and datapath")
	verdicts = flag.Bool("policy-verdict-events", true, "report allowed new flows as events (the agent's default)")
)

const prefix = "tdrbench"

func run(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

func must(out string, err error) string {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		cleanup()
		os.Exit(1)
	}
	return out
}

func cleanup() {
	for _, ns := range []string{prefix + "-node", prefix + "-a", prefix + "-b"} {
		_, _ = run("ip", "netns", "del", ns)
	}
	_ = os.RemoveAll("/sys/fs/bpf/" + prefix)
}

// topology: node netns routing between pod netns a (10.250.0.2) and b
// (10.250.0.3) over veth pairs, as the CNI plugin wires pods.
func setup() {
	cleanup()
	for _, ns := range []string{"node", "a", "b"} {
		must(run("ip", "netns", "add", prefix+"-"+ns))
	}
	node := prefix + "-node"
	must(run("ip", "-n", node, "link", "set", "lo", "up"))
	must(run("ip", "-n", node, "addr", "add", "10.250.0.1/32", "dev", "lo"))
	must(run("ip", "netns", "exec", node, "sysctl", "-qw", "net.ipv4.ip_forward=1"))
	for pod, ip := range map[string]string{"a": "10.250.0.2", "b": "10.250.0.3"} {
		host := prefix + pod
		ns := prefix + "-" + pod
		must(run("ip", "-n", node, "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", ns))
		must(run("ip", "-n", node, "link", "set", host, "up"))
		must(run("ip", "-n", node, "route", "add", ip+"/32", "dev", host))
		must(run("ip", "-n", ns, "link", "set", "lo", "up"))
		must(run("ip", "-n", ns, "link", "set", "eth0", "up"))
		must(run("ip", "-n", ns, "addr", "add", ip+"/32", "dev", "eth0"))
		must(run("ip", "-n", ns, "route", "add", "10.250.0.1", "dev", "eth0", "scope", "link"))
		must(run("ip", "-n", ns, "route", "add", "default", "via", "10.250.0.1"))
	}
}

// iperf runs one TCP test from a to b and returns Gbit/s.
func iperf() float64 {
	srv := exec.Command("nsenter", "--net=/run/netns/"+prefix+"-b", "iperf3", "-s", "-1", "-p", "5299")
	if err := srv.Start(); err != nil {
		must("", err)
	}
	defer func() { _ = srv.Wait() }()
	time.Sleep(300 * time.Millisecond)
	out := must(run("nsenter", "--net=/run/netns/"+prefix+"-a", "iperf3", "-c", "10.250.0.3", "-p", "5299", "-t",
		fmt.Sprint(int(duration.Seconds())), "-J"))
	var res struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		must("", fmt.Errorf("iperf3 output: %w", err))
	}
	return res.End.SumReceived.BitsPerSecond / 1e9
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func main() {
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench/datapath needs root")
		os.Exit(1)
	}
	setup()
	defer cleanup()

	// The loader works in the node's namespace (TCX attach by ifindex).
	runtime.LockOSThread()
	orig, _ := netns.Get()
	nodeNS, err := netns.GetFromName(prefix + "-node")
	must("", err)
	l := loader.New(loader.Config{BPFRoot: "/sys/fs/bpf/" + prefix, PolicyVerdictEvents: *verdicts}, nil)
	must("", netns.Set(nodeNS))
	must("", l.Start())
	dm := l.Maps()
	ifindex := func(name string) int {
		link, err := netlink.LinkByName(name)
		must("", err)
		return link.Attrs().Index
	}
	podA, podB := netip.MustParseAddr("10.250.0.2"), netip.MustParseAddr("10.250.0.3")
	idA, idB := uint32(5001), uint32(5002)
	for p, id := range map[netip.Addr]uint32{podA: idA, podB: idB} {
		must("", dm.UpsertIPCache(netip.PrefixFrom(p, 32), maps.IPCacheValue{Identity: id}))
	}
	must("", dm.UpsertIPCache(netip.MustParsePrefix("10.250.0.1/32"), maps.IPCacheValue{Identity: 1}))
	// 10,000 policy entries: the pods' own rules plus rules of 9,998 other
	// (endpoint, identity, port) combinations.
	must("", dm.UpsertPolicy(maps.PolicyKey{EndpointID: 1, Direction: maps.DirEgress, Identity: idB, Proto: 6, Port: 5299, PortPrefixLen: 16}, maps.PolicyValue{Cookie: 1}))
	must("", dm.UpsertPolicy(maps.PolicyKey{EndpointID: 2, Direction: maps.DirIngress, Identity: idA, Proto: 6, Port: 5299, PortPrefixLen: 16}, maps.PolicyValue{Cookie: 2}))
	must("", dm.UpsertPolicy(maps.PolicyKey{EndpointID: 1, Direction: maps.DirEgress, Identity: idB, Proto: 17, Port: 9, PortPrefixLen: 16}, maps.PolicyValue{Cookie: 3}))
	must("", dm.UpsertPolicy(maps.PolicyKey{EndpointID: 2, Direction: maps.DirIngress, Identity: idA, Proto: 17, Port: 9, PortPrefixLen: 16}, maps.PolicyValue{Cookie: 4}))
	for i := 0; i < 9998; i++ {
		must("", dm.UpsertPolicy(maps.PolicyKey{EndpointID: uint16(100 + i%500), Direction: uint8(i % 2), Identity: uint32(10000 + i), Proto: 6, Port: uint16(1 + i%60000), PortPrefixLen: 16}, maps.PolicyValue{}))
	}
	// 100,000 conntrack entries of other flows.
	far := uint64(time.Hour)
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	for i := 0; i < 100000; i++ {
		src := netip.AddrFrom4([4]byte{10, 251, byte(i >> 8), byte(i)})
		must("", dm.UpsertCT(maps.CTEntry{Src: src, Dst: podB, SrcPort: uint16(i), DstPort: 80, Proto: 6, Direction: maps.DirIngress, EndpointID: 2, Expires: uint64(ts.Nano()) + far}))
	}
	attach := func() {
		must("", l.AttachEndpoint(loader.EndpointInfo{ID: 1, IfIndex: ifindex(prefix + "a"), IfName: prefix + "a", Addresses: []netip.Addr{podA}, Identity: idA, EnforceIngress: true, EnforceEgress: true}))
		must("", l.AttachEndpoint(loader.EndpointInfo{ID: 2, IfIndex: ifindex(prefix + "b"), IfName: prefix + "b", Addresses: []netip.Addr{podB}, Identity: idB, EnforceIngress: true, EnforceEgress: true}))
	}
	detach := func() {
		must("", l.DetachEndpoint(1, []netip.Addr{podA}))
		must("", l.DetachEndpoint(2, []netip.Addr{podB}))
	}
	must("", netns.Set(orig))

	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	must("", err)
	defer stats.Close()
	from, to := l.Programs()
	var base, withDP []float64
	var nsPerRun []float64
	for r := 0; r < *rounds; r++ {
		base = append(base, iperf())
		_ = netns.Set(nodeNS)
		attach()
		_ = netns.Set(orig)
		s1, _ := from.Stats()
		t1, _ := to.Stats()
		withDP = append(withDP, iperf())
		s2, _ := from.Stats()
		t2, _ := to.Stats()
		runs := (s2.RunCount - s1.RunCount) + (t2.RunCount - t1.RunCount)
		rt := (s2.Runtime - s1.Runtime) + (t2.Runtime - t1.Runtime)
		if runs > 0 {
			nsPerRun = append(nsPerRun, float64(rt.Nanoseconds())/float64(runs))
		}
		_ = netns.Set(nodeNS)
		detach()
		_ = netns.Set(orig)
	}

	// New flows: UDP datagrams from a fresh socket (a new source port) each,
	// so every packet looks up policy and creates a conntrack entry, on the
	// way out of a and on the way into b.
	_ = netns.Set(nodeNS)
	attach()
	_ = netns.Set(orig)
	s1, _ := from.Stats()
	t1, _ := to.Stats()
	must(run("nsenter", "--net=/run/netns/"+prefix+"-a", "python3", "-c",
		"import socket\nfor i in range(20000):\n s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); s.sendto(b'x',('10.250.0.3',9)); s.close()"))
	s2, _ := from.Stats()
	t2, _ := to.Stats()
	createRuns := (s2.RunCount - s1.RunCount) + (t2.RunCount - t1.RunCount)
	create := float64(((s2.Runtime - s1.Runtime) + (t2.Runtime - t1.Runtime)).Nanoseconds()) / float64(max(createRuns, 1))
	ct, _ := dm.DumpCT()
	newFlows := 0
	for _, e := range ct {
		if e.Proto == 17 && e.DstPort == 9 {
			newFlows++
		}
	}

	b, d := median(base), median(withDP)
	fmt.Printf("| date (UTC) | baseline Gbit/s (median of %d) | through datapath Gbit/s | ratio | ns/packet, TCP stream (forward, established) | ns/packet, new UDP flows (policy + CT create) |\n", *rounds)
	fmt.Printf("|---|---|---|---|---|---|\n")
	fmt.Printf("| %s | %.2f | %.2f | %.1f%% | %.0f | %.0f |\n", time.Now().UTC().Format("2006-01-02 15:04"), b, d, 100*d/b, median(nsPerRun), create)
	fmt.Printf("\nNew-flow run: %d program runs, %d UDP conntrack entries created.\n", createRuns, newFlows)
	fmt.Printf("\nRounds: baseline %v, datapath %v (Gbit/s); per-run real-traffic cost per round %v ns.\n", fmtList(base), fmtList(withDP), fmtList(nsPerRun))
	_ = net.IPv4len
	_ = filepath.Join
}

func fmtList(v []float64) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = fmt.Sprintf("%.1f", x)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}
