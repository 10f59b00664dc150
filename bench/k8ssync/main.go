// Command k8ssync measures the agent's initial Kubernetes sync against a
// real kube-apiserver and etcd (pkg/testutil/k8senv): it fills the API
// server with Nodes, Services and EndpointSlices (10 endpoints each), then
// starts tendril-agent with --kubeconfig and reports how long its caches
// took to sync and its peak RSS. The baseline, in the same run, is a plain
// paginated LIST of the same objects by one client (what any informer pays
// at minimum). It prints a Markdown report.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tendril-net/tendril/pkg/testutil/k8senv"
)

func main() {
	nodes := flag.Int("nodes", 1000, "Node objects")
	services := flag.Int("services", 5000, "Services")
	slices := flag.Int("slices", 5000, "EndpointSlices (10 endpoints each)")
	agentBin := flag.String("agent", "bin/tendril-agent", "tendril-agent binary")
	workers := flag.Int("workers", 32, "concurrent creates while filling")
	flag.Parse()
	ctx := context.Background()

	env, err := k8senv.Start(ctx, k8senv.Options{})
	if err != nil {
		log.Fatalf("control plane: %v", err)
	}
	defer env.Stop()
	rc := env.RESTConfig()
	rc.QPS, rc.Burst = 5000, 5000
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		log.Fatal(err)
	}

	begin := time.Now()
	fill(ctx, cs, *nodes, *services, *slices, *workers)
	fillTime := time.Since(begin)

	baseline := listAll(ctx, cs)

	dir, err := os.MkdirTemp("", "k8ssync-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	// The first start also creates the CRDs; the second is a restart.
	firstSync, firstBoot, _ := runAgent(*agentBin, env.Kubeconfig(), dir)
	syncTime, bootstrap, rss := runAgent(*agentBin, env.Kubeconfig(), dir)

	fmt.Printf("## Kubernetes initial sync (%d Nodes, %d Services, %d EndpointSlices = %d endpoints)\n\n",
		*nodes, *services, *slices, *slices*10)
	fmt.Printf("| measure | value |\n|---|---|\n")
	fmt.Printf("| fill the API server (%d workers) | %s |\n", *workers, fillTime.Round(time.Millisecond))
	fmt.Printf("| baseline: one client's paginated LIST of nodes, services, endpointslices | %s |\n", baseline.Round(time.Millisecond))
	fmt.Printf("| agent, first start (creates the CRDs): caches synced | %s |\n", firstSync.Round(time.Millisecond))
	fmt.Printf("| agent, first start: whole bootstrap | %s |\n", firstBoot.Round(time.Millisecond))
	fmt.Printf("| agent, restart: watchers' caches synced (all 11 resources) | %s |\n", syncTime.Round(time.Millisecond))
	fmt.Printf("| agent, restart: ratio to the baseline | %.2f |\n", float64(syncTime)/float64(baseline))
	fmt.Printf("| agent, restart: whole bootstrap (start to API served) | %s |\n", bootstrap.Round(time.Millisecond))
	fmt.Printf("| agent, restart: peak RSS (VmHWM) after sync | %d MiB |\n", rss/1024)
}

func fill(ctx context.Context, cs kubernetes.Interface, nodes, services, slices, workers int) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bench"}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		log.Fatal(err)
	}
	jobs := make(chan func() error)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				if err := j(); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	// The node the agent runs as, with a pod CIDR.
	jobs <- func() error {
		_, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "bench-agent"},
			Spec: corev1.NodeSpec{PodCIDRs: []string{"10.200.0.0/24"}}}, metav1.CreateOptions{})
		return err
	}
	for i := 0; i < nodes; i++ {
		jobs <- func() error {
			n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%04d", i), Labels: map[string]string{"kubernetes.io/os": "linux"}},
				Spec: corev1.NodeSpec{PodCIDRs: []string{fmt.Sprintf("10.%d.%d.0/24", 64+i/256, i%256)}}}
			_, err := cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
			return err
		}
	}
	for i := 0; i < services; i++ {
		jobs <- func() error {
			s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("svc-%05d", i), Namespace: "bench"},
				Spec: corev1.ServiceSpec{Selector: map[string]string{"app": fmt.Sprintf("a%d", i)}, Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
			_, err := cs.CoreV1().Services("bench").Create(ctx, s, metav1.CreateOptions{})
			return err
		}
	}
	for i := 0; i < slices; i++ {
		jobs <- func() error {
			port, proto, name := int32(8080), corev1.ProtocolTCP, "http"
			es := &discoveryv1.EndpointSlice{
				ObjectMeta:  metav1.ObjectMeta{Name: fmt.Sprintf("svc-%05d-x", i), Namespace: "bench", Labels: map[string]string{discoveryv1.LabelServiceName: fmt.Sprintf("svc-%05d", i)}},
				AddressType: discoveryv1.AddressTypeIPv4,
				Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}},
			}
			for e := 0; e < 10; e++ {
				n := i*10 + e
				ready := true
				es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
					Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", 64+n/65536, (n/256)%256, n%256)},
					Conditions: discoveryv1.EndpointConditions{Ready: &ready},
				})
			}
			_, err := cs.DiscoveryV1().EndpointSlices("bench").Create(ctx, es, metav1.CreateOptions{})
			return err
		}
	}
	close(jobs)
	wg.Wait()
	if firstErr != nil {
		log.Fatalf("fill: %v", firstErr)
	}
}

// listAll lists the three big resources with 500-object pages, as a
// reflector's initial list does.
func listAll(ctx context.Context, cs kubernetes.Interface) time.Duration {
	begin := time.Now()
	opts := metav1.ListOptions{Limit: 500}
	for o := opts; ; {
		l, err := cs.CoreV1().Nodes().List(ctx, o)
		if err != nil {
			log.Fatal(err)
		}
		if o.Continue = l.Continue; o.Continue == "" {
			break
		}
	}
	for o := opts; ; {
		l, err := cs.CoreV1().Services("").List(ctx, o)
		if err != nil {
			log.Fatal(err)
		}
		if o.Continue = l.Continue; o.Continue == "" {
			break
		}
	}
	for o := opts; ; {
		l, err := cs.DiscoveryV1().EndpointSlices("").List(ctx, o)
		if err != nil {
			log.Fatal(err)
		}
		if o.Continue = l.Continue; o.Continue == "" {
			break
		}
	}
	return time.Since(begin)
}

var syncedRE = regexp.MustCompile(`msg="Kubernetes caches synced" duration=(\S+)`)
var readyRE = regexp.MustCompile(`msg="Agent ready" bootstrap=(\S+)`)

// runAgent starts the agent (without datapath, so no root needed for the
// control-plane measurement), waits for "Agent ready", reads its peak RSS
// and stops it.
func runAgent(bin, kubeconfig, dir string) (syncTime, bootstrap time.Duration, rssKiB int) {
	cmd := exec.Command(bin, "--kubeconfig", kubeconfig, "--node-name", "bench-agent",
		"--state-dir", filepath.Join(dir, "state"), "--socket", filepath.Join(dir, "a.sock"),
		"--bpf-root", "/sys/fs/bpf/tendril-k8ssync-unused", "--enable-datapath=false",
		"--install-host-networking=false", "--prometheus-serve-addr=")
	out, err := cmd.StderrPipe()
	if err != nil {
		log.Fatal(err)
	}
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		log.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if m := syncedRE.FindStringSubmatch(line); m != nil {
			syncTime, _ = time.ParseDuration(m[1])
		}
		if m := readyRE.FindStringSubmatch(line); m != nil {
			bootstrap, _ = time.ParseDuration(m[1])
			break
		}
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	if bootstrap == 0 {
		log.Fatal("agent never became ready")
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
	if err != nil {
		log.Fatal(err)
	}
	for _, l := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(l, "VmHWM:") {
			_, _ = fmt.Sscanf(strings.TrimSpace(strings.TrimPrefix(l, "VmHWM:")), "%d", &rssKiB)
		}
	}
	return syncTime, bootstrap, rssKiB
}
