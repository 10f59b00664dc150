// Command apifill measures how fast a real kube-apiserver + etcd
// (pkg/testutil/k8senv) accepts Services of one port and their EndpointSlices
// of 10 endpoints as their number grows — the fill of bench/services — and
// where the API server's CPU goes at a given count (a CPU profile from its
// /debug/pprof). It exists to tell the API server's cost from the agent's:
// no agent runs here.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/tendril-net/tendril/pkg/testutil/k8senv"
)

const benchNS = "apifill"

func main() {
	size := flag.Int("services", 30000, "services to create")
	workers := flag.Int("workers", 32, "concurrent creators")
	step := flag.Int("step", 2500, "report the rate every this many services")
	profileAt := flag.String("profile-at", "", "comma-separated service counts at which to take a CPU profile of kube-apiserver")
	profileSeconds := flag.Int("profile-seconds", 15, "length of each CPU profile")
	out := flag.String("out", "/tmp/apifill", "directory for the profiles")
	cidr := flag.String("service-cidr", "10.96.0.0/12", "the API server's service range")
	noSlices := flag.Bool("no-slices", false, "create Services only")
	flag.Parse()
	if err := run(*size, *workers, *step, *profileAt, *profileSeconds, *out, *cidr, !*noSlices); err != nil {
		log.Fatal(err)
	}
}

func run(size, workers, step int, profileAt string, profileSeconds int, out, cidr string, slices bool) error {
	ctx := context.Background()
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	env, err := k8senv.Start(ctx, k8senv.Options{ServiceCIDR: cidr})
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
	for i := 0; ; i++ {
		if _, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: benchNS}}, metav1.CreateOptions{}); err == nil || i > 50 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("namespace: %w", err)
	}
	profiles := map[int]bool{}
	for _, f := range strings.Split(profileAt, ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(f)); err == nil {
			profiles[n] = true
		}
	}
	var done atomic.Int64
	work := make(chan int)
	var wg sync.WaitGroup
	var firstErr atomic.Value
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				name := fmt.Sprintf("svc-%d", i)
				_, err := cs.CoreV1().Services(benchNS).Create(ctx, service(name), metav1.CreateOptions{})
				if err == nil && slices {
					_, err = cs.DiscoveryV1().EndpointSlices(benchNS).Create(ctx, slice(name), metav1.CreateOptions{})
				}
				if err != nil {
					firstErr.CompareAndSwap(nil, fmt.Errorf("create %s: %w", name, err))
				}
				done.Add(1)
			}
		}()
	}
	procs := children()
	t0 := time.Now()
	last, lastT, lastCPU := 0, t0, cpuTimes(procs)
	fmt.Printf("# apifill %s, %d workers, load %s\n", t0.UTC().Format("2006-01-02 15:04 MST"), workers, loadavg())
	fmt.Println("| services | rate /s | kube-apiserver CPU | etcd CPU | load |")
	fmt.Println("|---|---|---|---|---|")
	for i := 0; i < size; i++ {
		if profiles[i] {
			// Profile the API server for profileSeconds while the
			// creators go on (nothing is drained first).
			go func(at int) {
				p, err := cs.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", strconv.Itoa(profileSeconds)).DoRaw(ctx)
				if err != nil {
					log.Printf("profile at %d: %v", at, err)
					return
				}
				path := filepath.Join(out, fmt.Sprintf("apiserver-%d.pprof", at))
				if err := os.WriteFile(path, p, 0o644); err != nil {
					log.Printf("write %s: %v", path, err)
				}
			}(i)
		}
		work <- i
		if i > 0 && i%step == 0 {
			now := time.Now()
			cpu := cpuTimes(procs)
			dt := now.Sub(lastT).Seconds()
			fmt.Printf("| %d | %.0f | %.0f %% | %.0f %% | %s |\n", i, float64(i-last)/dt,
				100*(cpu["kube-apiserver"]-lastCPU["kube-apiserver"])/dt, 100*(cpu["etcd"]-lastCPU["etcd"])/dt, loadavg())
			last, lastT, lastCPU = i, now, cpu
		}
	}
	close(work)
	wg.Wait()
	fmt.Printf("# %d services in %s\n", size, time.Since(t0).Round(time.Second))
	if e := firstErr.Load(); e != nil {
		return e.(error)
	}
	return nil
}

func service(name string) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: benchNS},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "p", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}}}
}

func slice(name string) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name + "-1", Namespace: benchNS, Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("p"), Port: ptr(int32(8080)), Protocol: ptr(corev1.ProtocolTCP)}},
	}
	a := netip.MustParseAddr("10.244.2.10")
	for i := 0; i < 10; i++ {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{a.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}})
		a = a.Next()
	}
	return es
}

func ptr[T any](v T) *T { return &v }

// children finds this process's child processes by command name.
func children() map[string]int {
	out := map[string]int{}
	self := strconv.Itoa(os.Getpid())
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(stat)
		open, close := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || close < 0 {
			continue
		}
		f := strings.Fields(s[close+2:])
		if len(f) > 1 && f[1] == self {
			// The binaries carry their version (kube-apiserver-v1.36.3,
			// truncated by the kernel; etcd-v3.6.16).
			name := s[open+1 : close]
			for _, base := range []string{"kube-apiserver", "etcd"} {
				if strings.HasPrefix(name, base) {
					name = base
				}
			}
			out[name] = atoi(e.Name())
		}
	}
	return out
}

// cpuTimes is each child's user+system CPU in seconds.
func cpuTimes(procs map[string]int) map[string]float64 {
	out := map[string]float64{}
	for name, pid := range procs {
		stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		if err != nil {
			continue
		}
		s := string(stat)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		// utime and stime are fields 14 and 15 of stat, 12 and 13 here.
		out[name] = float64(atoi(f[11])+atoi(f[12])) / 100
	}
	return out
}

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}
