package cni_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// BenchmarkPrivilegedConcurrentAdd50 measures CNI ADD from exec to result
// with 50 ADDs started at once on one node, as a node does when 50 pods are
// scheduled together. Each iteration adds 50 pods (timed, each on its own)
// and deletes them (not timed). The latency includes what a runtime pays:
// exec of the plugin, the agent's IPAM and endpoint work, the veth and the
// pod's addresses and routes. Sub-benchmarks, in one run: the reference
// plugins (ptp + host-local of containernetworking/plugins, no agent, no
// policy, no eBPF), Tendril with its default configuration, and Tendril with
// each attach mode named.
func BenchmarkPrivilegedConcurrentAdd50(b *testing.B) {
	testutil.Privileged(b)
	benchmarkPlugins(b, 50)
}

// BenchmarkPrivilegedSerialAdd is the same with one ADD at a time: the
// baseline the concurrent numbers compare against (same machine, same run).
func BenchmarkPrivilegedSerialAdd(b *testing.B) {
	testutil.Privileged(b)
	benchmarkPlugins(b, 1)
}

func benchmarkPlugins(b *testing.B, pods int) {
	b.Run("reference", func(b *testing.B) {
		n, list := startReferenceNode(b)
		benchmarkConcurrentAdd(b, n, list, addBench{pods: pods})
	})
	// TENDRIL_BENCH_AGENT_ARGS adds agent flags, e.g. to profile the agent
	// (--pprof-serve-addr) or to take the eBPF datapath out of the
	// measurement (--enable-datapath=false).
	extra := strings.Fields(os.Getenv("TENDRIL_BENCH_AGENT_ARGS"))
	type variant struct {
		name string
		args []string
		opts addBench
	}
	variants := []variant{
		// The default moves new endpoints to TCX links once the node is
		// quiet: each round waits for that and reports how long it took.
		{"tendril-default", nil, addBench{pods: pods, waitPromoted: true}},
		{"tendril-tc", []string{"--datapath-attach-mode=tc"}, addBench{pods: pods}},
		{"tendril-tcx-undeferred", []string{"--datapath-attach-mode=tcx", "--datapath-defer-tcx=false"}, addBench{pods: pods}},
	}
	if pods > 1 {
		// The default again, the burst arriving while the agent moves as
		// many earlier pods to TCX links.
		variants = append(variants, variant{"tendril-default-during-promotion", nil, addBench{pods: pods, busy: pods}})
	}
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			n := startNode(b, append(append([]string(nil), v.args...), extra...)...)
			benchmarkConcurrentAdd(b, n, n.confList("tendril-cni", "1.1.0", nil), v.opts)
		})
	}
}

// addBench is one workload of benchmarkConcurrentAdd.
type addBench struct {
	// pods are added at once in each timed burst.
	pods int
	// busy pods are added (not timed) before each burst, which starts once
	// the agent has begun to move them to TCX links.
	busy int
	// waitPromoted waits after each burst until the agent has moved every
	// endpoint to TCX links, and reports the time from the burst's end.
	waitPromoted bool
}

// addWhilePromoting adds the busy pods and returns once the agent has
// begun to move them to TCX links (after 500 ms of quiet), so the timed
// burst that follows overlaps a promotion. On an idle node a promotion
// takes about a millisecond per endpoint (two RCU grace periods), so the
// status is polled without pause; when a whole promotion falls between two
// polls the busy pods are deleted and added again, at most three times.
func (n *node) addWhilePromoting(b *testing.B, list *libcni.NetworkConfigList, busy []*pod, burst func([]*pod) ([]time.Duration, []error)) {
	for attempt := 1; ; attempt++ {
		if _, errs := burst(busy); errors.Join(errs...) != nil {
			b.Fatalf("ADD of the busy pods: %v", errors.Join(errs...))
		}
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			switch p := n.pendingTCX(b); {
			case p > 0 && p < len(busy):
				return // the promotion has begun and goes on
			case p == 0:
				deadline = time.Time{} // missed: the whole promotion ran between two polls
			}
		}
		if attempt == 3 {
			b.Fatalf("in %d attempts the agent never was seen moving the busy pods to TCX links: the burst would not overlap a promotion", attempt)
		}
		for _, p := range busy {
			if err := n.del(list, p); err != nil {
				b.Fatalf("DEL %s: %v", p.name, err)
			}
		}
	}
}

var pendingRe = regexp.MustCompile(`(\d+) endpoints on tc filters`)

// pendingTCX is how many endpoints the agent has yet to move from tc
// filters to TCX links, from its status.
func (n *node) pendingTCX(b *testing.B) int {
	var st ext.StatusResponse
	if err := n.agent.Do(context.Background(), "GET", "/healthz", nil, nil, nil, &st); err != nil {
		b.Fatal(err)
	}
	m := pendingRe.FindStringSubmatch(sectionValue(&st, "Datapath", "programs"))
	if m == nil {
		return 0
	}
	v, _ := strconv.Atoi(m[1])
	return v
}

// waitNoPendingTCX waits until the agent has moved every endpoint to TCX
// links; the deadline only bounds a broken agent.
func (n *node) waitNoPendingTCX(b *testing.B) {
	deadline := time.Now().Add(time.Minute)
	for n.pendingTCX(b) > 0 {
		if time.Now().After(deadline) {
			b.Fatalf("%d endpoints still on tc filters after a minute", n.pendingTCX(b))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// startReferenceNode is a node namespace without an agent whose runtime
// runs the reference plugins: ptp with host-local IPAM, built by
// hack/cni-plugins.sh from the Go module proxy (cached outside the repo).
func startReferenceNode(b *testing.B) (*node, *libcni.NetworkConfigList) {
	out, err := exec.Command("../../hack/cni-plugins.sh").Output()
	if err != nil {
		b.Fatalf("hack/cni-plugins.sh: %v", err)
	}
	pluginDir := strings.TrimSpace(string(out))
	n := &node{t: b, name: "tdrcni-ref-" + randSuffix(), dir: b.TempDir()}
	n.netns = addNetns(b, n.name)
	n.binDir = pluginDir
	n.cache = filepath.Join(n.dir, "cni-cache")
	n.cni = n.runtime(n.cache)
	raw, err := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": "reference", "plugins": []any{map[string]any{
		"type": "ptp", "ipMasq": false, "mtu": 1500,
		"ipam": map[string]any{"type": "host-local", "subnet": "10.250.0.0/16", "dataDir": filepath.Join(n.dir, "ipam"),
			"routes": []any{map[string]any{"dst": "0.0.0.0/0"}}},
	}}})
	if err != nil {
		b.Fatal(err)
	}
	list, err := libcni.NetworkConfFromBytes(raw)
	if err != nil {
		b.Fatal(err)
	}
	return n, list
}

func benchmarkConcurrentAdd(b *testing.B, n *node, list *libcni.NetworkConfigList, opts addBench) {
	pods := opts.pods
	ps := make([]*pod, pods)
	for i := range ps {
		ps[i] = n.newPod(fmt.Sprintf("bench-%d", i))
	}
	others := make([]*pod, opts.busy)
	for i := range others {
		others[i] = n.newPod(fmt.Sprintf("busy-%d", i))
	}
	burst := func(ps []*pod) ([]time.Duration, []error) {
		durs := make([]time.Duration, len(ps))
		errs := make([]error, len(ps))
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i, p := range ps {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				t0 := time.Now()
				_, errs[i] = n.add(list, p)
				durs[i] = time.Since(t0)
			}()
		}
		close(start)
		wg.Wait()
		return durs, errs
	}
	var lat []time.Duration
	var promoted []time.Duration
	var cpu cpuUse
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		if len(others) > 0 {
			n.addWhilePromoting(b, list, others, burst)
		}
		before := n.cpuNow(b)
		b.StartTimer()
		durs, errs := burst(ps)
		b.StopTimer()
		cpu = cpu.add(n.cpuNow(b).sub(before))
		for i, err := range errs {
			if err != nil {
				b.Fatalf("ADD %s: %v", ps[i].name, err)
			}
		}
		lat = append(lat, durs...)
		if opts.waitPromoted {
			t0 := time.Now()
			n.waitNoPendingTCX(b)
			promoted = append(promoted, time.Since(t0))
		}
		for _, p := range append(append([]*pod(nil), ps...), others...) {
			if err := n.del(list, p); err != nil {
				b.Fatalf("DEL %s: %v", p.name, err)
			}
		}
		b.StartTimer()
	}
	b.StopTimer()
	if len(promoted) > 0 {
		slices.Sort(promoted)
		b.ReportMetric(float64(promoted[len(promoted)/2].Microseconds())/1000, "tcx-after-ms")
	}
	adds := float64(len(lat))
	b.ReportMetric(cpu.machine.Seconds()*1000/adds, "cpu-ms/add")
	b.ReportMetric(cpu.plugins.Seconds()*1000/adds, "plugin-cpu-ms/add")
	if n.cmd != nil {
		b.ReportMetric(cpu.agent.Seconds()*1000/adds, "agent-cpu-ms/add")
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	pct := func(q float64) float64 {
		return float64(lat[int(q*float64(len(lat)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
	b.ReportMetric(float64(len(lat)), "adds")
}

// cpuUse is CPU time spent during the timed bursts: by the whole machine
// (every process and the kernel's own threads), by the plugin processes
// (the test's reaped children) and by the agent.
type cpuUse struct{ machine, plugins, agent time.Duration }

func (c cpuUse) add(d cpuUse) cpuUse {
	return cpuUse{c.machine + d.machine, c.plugins + d.plugins, c.agent + d.agent}
}

func (c cpuUse) sub(d cpuUse) cpuUse {
	return cpuUse{c.machine - d.machine, c.plugins - d.plugins, c.agent - d.agent}
}

// clockTick is the kernel's USER_HZ, the unit of /proc's CPU times.
const clockTick = 10 * time.Millisecond

func (n *node) cpuNow(b *testing.B) cpuUse {
	var c cpuUse
	stat, err := os.ReadFile("/proc/stat")
	if err != nil {
		b.Fatal(err)
	}
	// cpu  user nice system idle iowait irq softirq steal ...: busy is all
	// but idle and iowait.
	fields := strings.Fields(strings.SplitN(string(stat), "\n", 2)[0])
	for i, f := range fields[1:] {
		if i == 3 || i == 4 {
			continue
		}
		v, _ := strconv.ParseInt(f, 10, 64)
		c.machine += time.Duration(v) * clockTick
	}
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_CHILDREN, &ru); err != nil {
		b.Fatal(err)
	}
	c.plugins = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	if n.cmd != nil && n.cmd.Process != nil {
		// The agent is a child too, but unreaped: it is not in RUSAGE_CHILDREN.
		pstat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", n.cmd.Process.Pid))
		if err == nil {
			// Fields after the command's closing parenthesis: utime is the
			// 12th, stime the 13th.
			rest := strings.Fields(string(pstat[strings.LastIndexByte(string(pstat), ')')+2:]))
			ut, _ := strconv.ParseInt(rest[11], 10, 64)
			st, _ := strconv.ParseInt(rest[12], 10, 64)
			c.agent = time.Duration(ut+st) * clockTick
		}
	}
	return c
}
