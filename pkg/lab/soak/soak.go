// Package soak churns pods on a running lab and then counts what the
// churn left behind. Pods are created and deleted through the API server
// at a steady rate, spread over the lab's nodes, so every one goes the
// lab's own way (the lab kubelet makes its network namespace and runs
// CNI ADD and DEL through tendril-cni and the node's agent). Each pod,
// selected by a policy, connects to a long-lived server pod on another
// node (allowed) and to a port the policy denies. At the end it counts,
// against a snapshot taken before the churn: addresses still allocated,
// endpoints, identities, BPF map entries, pinned objects, the agents'
// goroutines and file descriptors, network namespaces and interfaces;
// and it fits the agents' memory over the churn (leaks.go, rss.go).
// bench/soak and test/e2e's TestPrivilegedLabSoak run it.
package soak

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/yaml"

	"github.com/tendril-net/tendril/pkg/k8s"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/lab"
	"github.com/tendril-net/tendril/pkg/lab/workload"
)

// Labels and ports of the soak's pods.
const (
	roleLabel  = "soak-role"
	roleServer = "server"
	roleClient = "client"
	// allowedPort is the server port the policy allows the clients;
	// deniedPort is one it does not (the lab workload serves both).
	allowedPort = 80
	deniedPort  = 81
)

// Config is one soak run.
type Config struct {
	// Lab is the running lab (its nodes, sockets, BPF roots, pids).
	Lab *lab.State
	// Clients reach its API server.
	Clients *k8s.Clients
	// Namespace holds the soak's pods and policies; it is created, and
	// must hold nothing else.
	Namespace string
	// Duration of the churn.
	Duration time.Duration
	// Rate is how many pods a second are created (and as many deleted).
	Rate float64
	// Probes is how many connections each pod makes to the allowed port
	// of the server on another node (and one to the denied port).
	Probes int
	// SampleEvery is the agents' RSS sampling interval.
	SampleEvery time.Duration
	// Settle bounds the wait, after the last pod is gone, for the counts
	// to reach zero (identity GC grace, conntrack GC, ...).
	Settle time.Duration
	// MaxInFlight caps the pods alive at once: when the lab cannot keep
	// up, creation waits rather than piling up.
	MaxInFlight int
	// Allow is the steady-state allowance for the counts that move on
	// their own.
	Allow Allowance
	// BeforeEnd, when set, runs once the churn stopped and before the
	// leaks are counted: a test hook that injects a leak to prove the
	// counts see it.
	BeforeEnd func(context.Context) error
	Log       *slog.Logger
}

// Allowance is how far counts that move without leaking may be from the
// start: goroutines (a request in flight, an idle connection's reader)
// and file descriptors (the same connections' sockets).
type Allowance struct {
	Goroutines int
	FDs        int
}

// DefaultConfig is the bench's default run: an hour at 10 pods a second.
func DefaultConfig() Config {
	return Config{Namespace: "soak", Duration: time.Hour, Rate: 10, Probes: 3, SampleEvery: 10 * time.Second,
		Settle: 6 * time.Minute, MaxInFlight: 64, Allow: Allowance{Goroutines: 25, FDs: 10}}
}

func (c *Config) validate() error {
	switch {
	case c.Lab == nil || c.Clients == nil:
		return errors.New("soak: no lab")
	case len(c.Lab.Nodes) < 2:
		return fmt.Errorf("soak: lab %s has %d node(s), the soak needs 2 or more", c.Lab.Name, len(c.Lab.Nodes))
	case c.Lab.Runtime != "":
		return fmt.Errorf("soak: lab %s runs --runtime %s; the soak reads the lab kubelet's pod records", c.Lab.Name, c.Lab.Runtime)
	case c.Duration <= 0 || c.Rate <= 0 || c.Probes < 1 || c.SampleEvery <= 0 || c.MaxInFlight < 1:
		return fmt.Errorf("soak: duration %s, rate %g, probes %d, sample interval %s, in flight %d: each must be positive",
			c.Duration, c.Rate, c.Probes, c.SampleEvery, c.MaxInFlight)
	}
	return nil
}

// Churn is what the churn did.
type Churn struct {
	Created, Ready, Deleted int64
	// Failed pods never ran Ready, or could not be created or deleted.
	Failed int64
	// AllowedOK and AllowedFailed count pods whose connections to the
	// allowed port were answered (after the pod's identity reached the
	// server's node) or never were; DeniedOK counts connections to the
	// denied port that went unanswered, DeniedAnswered those answered
	// (the policy did not hold).
	AllowedOK, AllowedFailed, DeniedOK, DeniedAnswered int64
	Elapsed                                            time.Duration
	FirstError                                         string
}

// Result is a soak run's outcome.
type Result struct {
	Config Config
	Churn  Churn
	// Leaks are the counts at the end, by node ("" for the cluster).
	Leaks []Count
	// Memory is each agent's RSS fit over the churn.
	Memory []Slope
	// CPU is the machine's CPU over the churn, by process group.
	CPU CPUUse
	// SettledIn is how long after the last pod was gone the counts took
	// to reach zero (or the Settle bound when they did not).
	SettledIn time.Duration
}

// Passed says whether nothing leaked and the churn itself held.
func (r *Result) Passed() bool {
	for _, c := range r.Leaks {
		if c.Leaked() {
			return false
		}
	}
	return r.Churn.Failed == 0 && r.Churn.AllowedFailed == 0 && r.Churn.DeniedAnswered == 0 && r.Churn.Ready > 0
}

// Run sets up the servers and the policy, churns for cfg.Duration, waits
// for the pods to go, and counts the leaks.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	// The pod informer's and the sampler's goroutines end with the run.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s := &soaker{cfg: cfg, ns: cfg.Namespace, ready: map[string]chan *corev1.Pod{}, ips: map[string]bool{}}
	defer s.cleanup()
	if err := s.setup(ctx); err != nil {
		return nil, err
	}
	before, err := s.baseline(ctx)
	if err != nil {
		return nil, err
	}
	sampler := newRSSSampler(cfg.Lab, cfg.SampleEvery)
	sctx, stopSampling := context.WithCancel(ctx)
	samplingDone := make(chan struct{})
	go func() { defer close(samplingDone); sampler.run(sctx) }()
	churnErr := s.churn(ctx)
	stopSampling()
	<-samplingDone
	st := s.stats()
	res := &Result{Config: cfg, Churn: st, Memory: sampler.slopes(), CPU: sampler.cpu.use(runtime.NumCPU())}
	if churnErr != nil {
		return res, churnErr
	}
	if err := s.waitGone(ctx); err != nil {
		return res, err
	}
	if cfg.BeforeEnd != nil {
		if err := cfg.BeforeEnd(ctx); err != nil {
			return res, fmt.Errorf("soak: before-end hook: %w", err)
		}
	}
	gone := time.Now()
	deadline := gone.Add(cfg.Settle)
	for {
		after, err := snapshot(ctx, cfg.Lab, cfg.Clients, s.ns, s.churnIPs())
		if err != nil {
			return res, fmt.Errorf("soak: snapshot after the churn: %w", err)
		}
		res.Leaks = compare(before, after, cfg.Allow)
		res.SettledIn = time.Since(gone)
		leaked := false
		for _, c := range res.Leaks {
			leaked = leaked || c.Leaked()
		}
		if !leaked || time.Now().After(deadline) {
			return res, nil
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(5 * time.Second):
		}
	}
}

// baseline is the snapshot before the churn, once two in a row five
// seconds apart agree: the servers' endpoints finish their regeneration
// (links pinned, policy entries written) a moment after they run Ready.
func (s *soaker) baseline(ctx context.Context) (*clusterSnap, error) {
	prev, err := snapshot(ctx, s.cfg.Lab, s.cfg.Clients, s.ns, nil)
	if err != nil {
		return nil, fmt.Errorf("soak: snapshot before the churn: %w", err)
	}
	for deadline := time.Now().Add(2 * time.Minute); ; {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(5 * time.Second):
		}
		cur, err := snapshot(ctx, s.cfg.Lab, s.cfg.Clients, s.ns, nil)
		if err != nil {
			return nil, fmt.Errorf("soak: snapshot before the churn: %w", err)
		}
		var moved []string
		for _, c := range compare(prev, cur, s.cfg.Allow) {
			if c.Leaked() {
				moved = append(moved, fmt.Sprintf("%s %s %+d", c.Node, c.What, c.N))
			}
		}
		if len(moved) == 0 {
			return cur, nil
		}
		if time.Now().After(deadline) {
			s.cfg.Log.Warn("soak: the lab did not settle before the churn; counting from the last snapshot", "moving", moved)
			return cur, nil
		}
		prev = cur
	}
}

// soaker is one run's churn state.
type soaker struct {
	cfg     Config
	ns      string
	servers map[string]string // node -> server pod address

	mu    sync.Mutex
	ready map[string]chan *corev1.Pod
	ips   map[string]bool

	created, readyN, deleted, failed             atomic.Int64
	allowedOK, allowedFailed, deniedOK, deniedAn atomic.Int64
	firstErr                                     atomic.Value
	elapsed                                      time.Duration
}

func (s *soaker) fail(format string, args ...any) {
	s.failed.Add(1)
	msg := fmt.Sprintf(format, args...)
	s.firstErr.CompareAndSwap(nil, msg)
	s.cfg.Log.Warn("soak: pod failed", "error", msg)
}

func (s *soaker) stats() Churn {
	c := Churn{Created: s.created.Load(), Ready: s.readyN.Load(), Deleted: s.deleted.Load(), Failed: s.failed.Load(),
		AllowedOK: s.allowedOK.Load(), AllowedFailed: s.allowedFailed.Load(), DeniedOK: s.deniedOK.Load(),
		DeniedAnswered: s.deniedAn.Load(), Elapsed: s.elapsed}
	if v := s.firstErr.Load(); v != nil {
		c.FirstError = v.(string)
	}
	return c
}

func (s *soaker) churnIPs() map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]bool, len(s.ips))
	for ip := range s.ips {
		out[ip] = true
	}
	return out
}

// policies: the servers admit the clients on the allowed port only; the
// clients may reach the servers on the allowed port only. Both select
// pods by role, so every client's identity enters the servers' policy
// maps and must leave them again.
func (s *soaker) policies() ([]*v1alpha1.TendrilNetworkPolicy, error) {
	docs := []string{`
metadata: {name: soak-servers}
spec:
  endpointSelector: {matchLabels: {` + roleLabel + `: ` + roleServer + `}}
  ingress:
  - fromEndpoints: [{matchLabels: {` + roleLabel + `: ` + roleClient + `}}]
    toPorts: [{ports: [{port: "` + strconv.Itoa(allowedPort) + `", protocol: TCP}]}]
`, `
metadata: {name: soak-clients}
spec:
  endpointSelector: {matchLabels: {` + roleLabel + `: ` + roleClient + `}}
  egress:
  - toEndpoints: [{matchLabels: {` + roleLabel + `: ` + roleServer + `}}]
    toPorts: [{ports: [{port: "` + strconv.Itoa(allowedPort) + `", protocol: TCP}]}]
`}
	var out []*v1alpha1.TendrilNetworkPolicy
	for _, d := range docs {
		p := &v1alpha1.TendrilNetworkPolicy{}
		if err := yaml.UnmarshalStrict([]byte(d), p); err != nil {
			return nil, fmt.Errorf("soak policy: %w", err)
		}
		out = append(out, p)
	}
	return out, nil
}

// setup makes the namespace, a server pod on every node and the
// policies, and starts the pod informer that tells the churn when its
// pods run.
func (s *soaker) setup(ctx context.Context) error {
	cs := s.cfg.Clients.Core
	_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: s.ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("soak: create namespace %s: %w", s.ns, err)
	}
	pods, err := cs.CoreV1().Pods(s.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("soak: list pods of %s: %w", s.ns, err)
	}
	if len(pods.Items) > 0 {
		return fmt.Errorf("soak: namespace %s already holds %d pods: a soak needs it to itself", s.ns, len(pods.Items))
	}
	fac := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(s.ns))
	inf := fac.Core().V1().Pods().Informer()
	notify := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok || !lab.PodReady(p) {
			return
		}
		s.mu.Lock()
		ch := s.ready[p.Name]
		delete(s.ready, p.Name)
		s.mu.Unlock()
		if ch != nil {
			ch <- p
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: notify, UpdateFunc: func(_, n any) { notify(n) }}); err != nil {
		return fmt.Errorf("soak: pod informer: %w", err)
	}
	fac.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return errors.New("soak: pod informer did not sync")
	}

	s.servers = map[string]string{}
	waits := map[string]chan *corev1.Pod{}
	for _, n := range s.cfg.Lab.Nodes {
		name := "soak-server-" + n.Name
		waits[n.Name] = s.expect(name)
		if err := s.createPod(ctx, name, n.Name, map[string]string{roleLabel: roleServer}); err != nil {
			return err
		}
	}
	for node, ch := range waits {
		select {
		case p := <-ch:
			s.servers[node] = p.Status.PodIP
		case <-time.After(3 * time.Minute):
			return fmt.Errorf("soak: server pod on %s not Ready after 3 minutes", node)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	pols, err := s.policies()
	if err != nil {
		return err
	}
	for _, p := range pols {
		if _, err := s.cfg.Clients.Tendril.TendrilV1alpha1().TendrilNetworkPolicies(s.ns).Create(ctx, p, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("soak: create policy %s: %w", p.Name, err)
		}
	}
	return nil
}

// expect registers a wait for the pod to run Ready.
func (s *soaker) expect(name string) chan *corev1.Pod {
	ch := make(chan *corev1.Pod, 1)
	s.mu.Lock()
	s.ready[name] = ch
	s.mu.Unlock()
	return ch
}

func (s *soaker) createPod(ctx context.Context, name, node string, labels map[string]string) error {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: name, Labels: labels},
		Spec: corev1.PodSpec{
			Containers:   []corev1.Container{{Name: "main", Image: "lab"}},
			NodeSelector: map[string]string{"kubernetes.io/hostname": node},
		},
	}
	if _, err := s.cfg.Clients.Core.CoreV1().Pods(s.ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("soak: create pod %s: %w", name, err)
	}
	return nil
}

// churn creates cfg.Rate pods a second for cfg.Duration, alternating
// nodes; each runs its probes and is deleted (pod.go).
func (s *soaker) churn(ctx context.Context) error {
	start := time.Now()
	defer func() { s.elapsed = time.Since(start) }()
	tick := time.NewTicker(time.Duration(float64(time.Second) / s.cfg.Rate))
	defer tick.Stop()
	end := time.After(s.cfg.Duration)
	slots := make(chan struct{}, s.cfg.MaxInFlight)
	var wg sync.WaitGroup
	defer wg.Wait()
	nodes := s.cfg.Lab.Nodes
	lastLog := time.Now()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-end:
			return nil
		case <-tick.C:
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		node, other := nodes[i%len(nodes)], nodes[(i+1)%len(nodes)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			s.lifecycle(ctx, "soak-"+strconv.Itoa(i), node.Name, s.servers[other.Name])
		}()
		if time.Since(lastLog) > 30*time.Second {
			lastLog = time.Now()
			c := s.stats()
			s.cfg.Log.Info("soak: churning", "elapsed", time.Since(start).Round(time.Second), "created", c.Created, "ready", c.Ready,
				"deleted", c.Deleted, "failed", c.Failed, "in_flight", len(slots))
		}
	}
}

// lifecycle is one client pod: created on node, Ready, its probes to the
// server on another node, deleted.
func (s *soaker) lifecycle(ctx context.Context, name, node, server string) {
	ch := s.expect(name)
	if err := s.createPod(ctx, name, node, map[string]string{roleLabel: roleClient, "soak-pod": name}); err != nil {
		s.mu.Lock()
		delete(s.ready, name)
		s.mu.Unlock()
		s.fail("%v", err)
		return
	}
	s.created.Add(1)
	defer s.deletePod(name)
	var pod *corev1.Pod
	select {
	case pod = <-ch:
	case <-time.After(2 * time.Minute):
		s.mu.Lock()
		delete(s.ready, name)
		s.mu.Unlock()
		s.fail("pod %s on %s not Ready after 2 minutes", name, node)
		return
	case <-ctx.Done():
		return
	}
	s.readyN.Add(1)
	s.mu.Lock()
	for _, ip := range pod.Status.PodIPs {
		s.ips[ip.IP] = true
	}
	s.mu.Unlock()
	rec, err := s.cfg.Lab.Pod(s.ns, name)
	if err != nil {
		s.fail("pod %s: %v", name, err)
		return
	}
	s.probe(ctx, rec, server)
}

// probe makes the pod's connections from inside its network namespace:
// cfg.Probes to the allowed port, each retried until the pod's identity
// has reached the server's node (a bounded wait, as a pod's first
// connection after it starts), and one to the denied port, which must
// go unanswered.
func (s *soaker) probe(ctx context.Context, rec *lab.PodRecord, server string) {
	allowed := server + ":" + strconv.Itoa(allowedPort)
	denied := server + ":" + strconv.Itoa(deniedPort)
	err := lab.InNetns(rec.NetnsFile(), func() error {
		for range s.cfg.Probes {
			deadline := time.Now().Add(30 * time.Second)
			for {
				_, err := workload.Probe(ctx, allowed, false, time.Second)
				if err == nil {
					break
				}
				if time.Now().After(deadline) || ctx.Err() != nil {
					return fmt.Errorf("%s -> %s: %w", rec.Name, allowed, err)
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
		if out, err := workload.Probe(ctx, denied, false, 500*time.Millisecond); err == nil {
			s.deniedAn.Add(1)
			s.firstErr.CompareAndSwap(nil, fmt.Sprintf("%s -> %s answered under a policy that denies it: %q", rec.Name, denied, out))
		} else {
			s.deniedOK.Add(1)
		}
		return nil
	})
	if err != nil {
		s.allowedFailed.Add(1)
		s.firstErr.CompareAndSwap(nil, err.Error())
		return
	}
	s.allowedOK.Add(1)
}

func (s *soaker) deletePod(name string) {
	zero := int64(0)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := s.cfg.Clients.Core.CoreV1().Pods(s.ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	if err != nil && !apierrors.IsNotFound(err) {
		s.fail("delete pod %s: %v", name, err)
		return
	}
	s.deleted.Add(1)
}

// clientRecords are the lab kubelets' records of the soak's client pods:
// a pod deleted with no grace period leaves the API at once, and its
// kubelet tears its sandbox down (CNI DEL, namespace) after.
func (s *soaker) clientRecords() ([]string, error) {
	entries, err := os.ReadDir(s.cfg.Lab.PodDir())
	if err != nil {
		return nil, fmt.Errorf("soak: lab pod records: %w", err)
	}
	var out []string
	for _, e := range entries {
		n := e.Name()
		if strings.HasPrefix(n, s.ns+"_soak-") && !strings.HasPrefix(n, s.ns+"_soak-server-") && strings.HasSuffix(n, ".json") {
			out = append(out, strings.TrimSuffix(n, ".json"))
		}
	}
	return out, nil
}

// cleanup removes the servers and the policies, so that the namespace
// can hold the next run.
func (s *soaker) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	zero := int64(0)
	if err := s.cfg.Clients.Core.CoreV1().Pods(s.ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{}); err != nil {
		s.cfg.Log.Warn("soak: remove the pods", "error", err)
	}
	if err := s.cfg.Clients.Tendril.TendrilV1alpha1().TendrilNetworkPolicies(s.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		s.cfg.Log.Warn("soak: remove the policies", "error", err)
	}
}

// waitGone waits until no client pod is left in the API and in the lab's
// pod records (the kubelets ran CNI DEL and removed their namespaces).
func (s *soaker) waitGone(ctx context.Context) error {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		pods, err := s.cfg.Clients.Core.CoreV1().Pods(s.ns).List(ctx, metav1.ListOptions{LabelSelector: roleLabel + "=" + roleClient})
		if err != nil {
			return fmt.Errorf("soak: list pods: %w", err)
		}
		records, err := s.clientRecords()
		if err != nil {
			return err
		}
		if len(pods.Items) == 0 && len(records) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("soak: 5 minutes after the churn, %d client pods still in the API, %d still run by the kubelets (%v)",
				len(pods.Items), len(records), records[:min(len(records), 3)])
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
