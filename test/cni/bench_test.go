package cni_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"

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
		benchmarkConcurrentAdd(b, n, list, pods)
	})
	// TENDRIL_BENCH_AGENT_ARGS adds agent flags, e.g. to profile the agent
	// (--pprof-serve-addr) or to take the eBPF datapath out of the
	// measurement (--enable-datapath=false).
	extra := strings.Fields(os.Getenv("TENDRIL_BENCH_AGENT_ARGS"))
	for _, mode := range []string{"default", "tc", "tcx"} {
		b.Run("tendril-"+mode, func(b *testing.B) {
			args := extra
			if mode != "default" {
				args = append([]string{"--datapath-attach-mode=" + mode}, extra...)
			}
			n := startNode(b, args...)
			benchmarkConcurrentAdd(b, n, n.confList("tendril-cni", "1.1.0", nil), pods)
		})
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

func benchmarkConcurrentAdd(b *testing.B, n *node, list *libcni.NetworkConfigList, pods int) {
	ps := make([]*pod, pods)
	for i := range ps {
		ps[i] = n.newPod(fmt.Sprintf("bench-%d", i))
	}
	var lat []time.Duration
	b.ResetTimer()
	for range b.N {
		durs := make([]time.Duration, pods)
		errs := make([]error, pods)
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
		b.StopTimer()
		for i, err := range errs {
			if err != nil {
				b.Fatalf("ADD %s: %v", ps[i].name, err)
			}
		}
		lat = append(lat, durs...)
		for _, p := range ps {
			if err := n.del(list, p); err != nil {
				b.Fatalf("DEL %s: %v", p.name, err)
			}
		}
		b.StartTimer()
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	pct := func(q float64) float64 {
		return float64(lat[int(q*float64(len(lat)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
	b.ReportMetric(float64(len(lat)), "adds")
}
