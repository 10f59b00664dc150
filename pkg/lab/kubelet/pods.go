package kubelet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"

	"github.com/tendril-net/tendril/pkg/lab"
	"github.com/tendril-net/tendril/pkg/lab/workload"
)

// podManager runs one worker per pod (by UID) bound to this node.
type podManager struct {
	cs   kubernetes.Interface
	st   *lab.State
	node *lab.Node
	cni  *cniRuntime
	log  *slog.Logger

	mu      sync.Mutex
	workers map[types.UID]*podWorker
}

func newPodManager(cs kubernetes.Interface, st *lab.State, node *lab.Node, cni *cniRuntime, log *slog.Logger) *podManager {
	return &podManager{cs: cs, st: st, node: node, cni: cni, log: log, workers: map[types.UID]*podWorker{}}
}

func (m *podManager) run(ctx context.Context) error {
	if err := os.MkdirAll(filepath.Join(m.st.LogDir(), "pods"), 0o755); err != nil {
		return err
	}
	factory := informers.NewSharedInformerFactoryWithOptions(m.cs, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", m.node.Name).String()
	}))
	_, err := factory.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { m.observe(ctx, obj, false) },
		UpdateFunc: func(_, obj any) { m.observe(ctx, obj, false) },
		DeleteFunc: func(obj any) { m.observe(ctx, obj, true) },
	})
	if err != nil {
		return err
	}
	factory.Start(ctx.Done())
	<-ctx.Done()
	factory.Shutdown()
	return nil
}

// observe hands the newest version of a pod to its worker.
func (m *podManager) observe(ctx context.Context, obj any, deleted bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj, deleted = d.Obj, true
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	m.mu.Lock()
	w, ok := m.workers[pod.UID]
	if !ok {
		if deleted {
			m.mu.Unlock()
			return
		}
		w = &podWorker{m: m, uid: pod.UID, kick: make(chan struct{}, 1),
			log: m.log.With("pod", pod.Namespace+"/"+pod.Name)}
		m.workers[pod.UID] = w
		go w.loop(ctx)
	}
	m.mu.Unlock()
	w.set(pod, deleted)
}

func (m *podManager) forget(uid types.UID) {
	m.mu.Lock()
	delete(m.workers, uid)
	m.mu.Unlock()
}

// podWorker brings one pod to the state its object asks for: running, or
// torn down once the pod is deleted or terminating.
type podWorker struct {
	m    *podManager
	uid  types.UID
	log  *slog.Logger
	kick chan struct{}

	mu      sync.Mutex
	latest  *corev1.Pod
	deleted bool

	// Owned by loop.
	sandbox *sandbox
}

// sandbox is what runs for a pod: its namespace, CNI attachment and
// workload.
type sandbox struct {
	att   attachment
	netns string
	ips   []string
	// cgroup is the container's cgroup (lab.PodCgroupDir) below the
	// node's; "" when the node has none.
	cgroup   string
	workload *exec.Cmd
	exited   chan struct{}
	// stopping is set before teardown kills the workload, so its exit is
	// not reported as a crash.
	stopping atomic.Bool
}

func (w *podWorker) set(pod *corev1.Pod, deleted bool) {
	w.mu.Lock()
	w.latest, w.deleted = pod, w.deleted || deleted
	w.mu.Unlock()
	w.poke()
}

func (w *podWorker) poke() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

func (w *podWorker) loop(ctx context.Context) {
	backoff := 500 * time.Millisecond
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.kick:
		}
		w.mu.Lock()
		pod, deleted := w.latest, w.deleted
		w.mu.Unlock()
		if deleted || pod.DeletionTimestamp != nil {
			w.teardown()
			if !deleted {
				w.finishDeletion(ctx, pod)
				continue // the delete event ends the worker
			}
			w.m.forget(w.uid)
			return
		}
		if w.sandbox != nil {
			continue
		}
		if err := w.setup(ctx, pod); err != nil {
			w.log.Warn("Start pod", "error", err, "retry-in", backoff)
			w.teardown()
			time.AfterFunc(backoff, w.poke)
			backoff = min(2*backoff, 10*time.Second)
			continue
		}
		backoff = 500 * time.Millisecond
	}
}

// containerID names the pod's sandbox for CNI, derived from the UID so a
// restarted kubelet finds the same attachment.
func containerID(uid types.UID) string {
	sum := sha256.Sum256([]byte(uid))
	return hex.EncodeToString(sum[:])
}

// workloadPorts are the TCP and UDP ports the pod's containers declare;
// none declared means 80 and 81 on both.
func workloadPorts(pod *corev1.Pod) (tcp, udp []int) {
	seen := map[string]bool{}
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			proto := p.Protocol
			if proto == "" {
				proto = corev1.ProtocolTCP // the API's default
			}
			key := fmt.Sprint(proto, p.ContainerPort)
			if seen[key] {
				continue
			}
			seen[key] = true
			switch proto {
			case corev1.ProtocolTCP:
				tcp = append(tcp, int(p.ContainerPort))
			case corev1.ProtocolUDP:
				udp = append(udp, int(p.ContainerPort))
			}
		}
	}
	if len(seen) == 0 {
		tcp, udp = []int{80, 81}, []int{80, 81}
	}
	sort.Ints(tcp)
	sort.Ints(udp)
	return tcp, udp
}

func (w *podWorker) setup(ctx context.Context, pod *corev1.Pod) error {
	start := time.Now()
	st, node := w.m.st, w.m.node
	uid := string(pod.UID)
	sb := &sandbox{netns: lab.NetnsPrefix(st.Name) + "pod-" + strings.ReplaceAll(uid, "-", "")[:12]}
	sb.att = attachment{ContainerID: containerID(pod.UID), NetnsPath: lab.NetnsPath(sb.netns),
		Namespace: pod.Namespace, Name: pod.Name, UID: uid}
	w.sandbox = sb
	if err := lab.CreateNetns(sb.netns); err != nil {
		return err
	}
	actx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	ips, err := w.m.cni.add(actx, sb.att)
	cancel()
	if err != nil {
		return err
	}
	sb.ips = ips

	rec := lab.PodRecord{Namespace: pod.Namespace, Name: pod.Name, UID: uid, Node: node.Name,
		Netns: sb.netns, ContainerID: sb.att.ContainerID, IPs: ips}
	if lab.PodUsesClusterDNS(pod) {
		// What the kubelet mounts as the container's /etc/resolv.conf; the
		// lab's pods share the machine's file system, so `lab exec` mounts
		// it in a mount namespace of its own.
		rec.ResolvConf = st.PodResolvConfPath(pod.Namespace, pod.Name)
		if err := os.WriteFile(rec.ResolvConf, []byte(lab.ResolvConf(pod.Namespace)), 0o644); err != nil {
			return fmt.Errorf("write the pod's resolv.conf: %w", err)
		}
	}
	if node.Cgroup != "" {
		// The pod's own cgroup, named as the kubelet names it, so the
		// agent's cgroup scan finds the pod by its UID.
		sb.cgroup = lab.PodCgroupDir(node.Cgroup, pod.Status.QOSClass, uid, sb.att.ContainerID)
		if err := lab.CreatePodCgroup(sb.cgroup); err != nil {
			return err
		}
		rec.Cgroup = sb.cgroup
	}
	tcp, udp := workloadPorts(pod)
	if err := w.startWorkload(sb, pod, tcp, udp); err != nil {
		return err
	}
	if err := st.WritePod(rec); err != nil {
		return err
	}
	if err := w.writeRunning(ctx, pod, sb, start); err != nil {
		return err
	}
	w.log.Info("Pod running", "ips", ips, "tcp", tcp, "udp", udp, "duration", time.Since(start))
	return nil
}

// startWorkload runs tendril-workload in the pod's namespace and
// waits until it listens on every port: it writes a line to the pipe it
// gets as fd 3 once all its sockets are bound.
func (w *podWorker) startWorkload(sb *sandbox, pod *corev1.Pod, tcp, udp []int) error {
	st := w.m.st
	logPath := filepath.Join(st.LogDir(), "pods", pod.Namespace+"_"+pod.Name+"_"+string(pod.UID)[:8]+".log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	defer pr.Close()
	coreDNS := isCoreDNS(pod)
	argv := []string{"nsenter", "--net=" + lab.NetnsPath(sb.netns), filepath.Join(st.BinDir, lab.WorkloadBinary),
		"--pod-name", pod.Name, "--tcp", workload.FormatPorts(tcp), "--udp", workload.FormatPorts(udp), "--ready-fd", "3"}
	// A lab pod whose container asks for it answers with the address it
	// sees the client from too (tests of source NAT and its absence).
	if len(pod.Spec.Containers) > 0 && slices.Contains(pod.Spec.Containers[0].Args, "--report-peer") {
		argv = append(argv, "--report-peer")
	}
	if coreDNS {
		if st.CoreDNSBin == "" {
			pw.Close()
			return fmt.Errorf("image %s: the lab has no CoreDNS binary (a lab made before cluster DNS: lab up again)", lab.CoreDNSImage)
		}
		argv = append([]string{"nsenter", "--net=" + lab.NetnsPath(sb.netns), st.CoreDNSBin}, pod.Spec.Containers[0].Args...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if !coreDNS {
		cmd.ExtraFiles = []*os.File{pw}
	}
	// A session of its own: signals to the kubelet's group do not reach it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if cg := sb.cgroup; cg != "" {
		// Started straight into the pod's cgroup (CLONE_INTO_CGROUP), below
		// the node's, where the node's agent attaches socket
		// load-balancing: the pod's connections are translated by its own
		// node, as on a real one.
		cgf, err := lab.OpenCgroup(cg)
		if err != nil {
			pw.Close()
			return err
		}
		defer cgf.Close()
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(cgf.Fd())
	}
	err = cmd.Start()
	pw.Close()
	if err != nil {
		return fmt.Errorf("start workload: %w", err)
	}
	sb.workload, sb.exited = cmd, make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(sb.exited)
	}()
	ready := make(chan error, 1)
	if coreDNS {
		// CoreDNS says it is ready on its ready plugin's port once its
		// kubernetes plugin has synced with the API server (through the
		// kubernetes Service): only then may it be a kube-dns endpoint.
		go func() { ready <- waitCoreDNSReady(sb, 55*time.Second) }()
	} else {
		go w.waitReadyFD(pr, ready)
	}
	// The ready channel always answers in the end (the pipe's EOF when
	// the workload dies; CoreDNS's wait is bounded): no goroutine leaks.
	wait := 30 * time.Second
	if coreDNS {
		wait = time.Minute
	}
	select {
	case err := <-ready:
		if err != nil {
			return fmt.Errorf("workload did not come up (see %s): %w", logPath, err)
		}
	case <-time.After(wait):
		return fmt.Errorf("workload not ready after %s (see %s)", wait, logPath)
	}
	go func() {
		<-sb.exited
		// A workload that dies on its own (not by teardown) is reported;
		// restarting containers is not part of the lab yet.
		if !sb.stopping.Load() {
			w.log.Warn("Workload exited", "state", cmd.ProcessState)
		}
	}()
	return nil
}

// writeRunning publishes the pod as running and ready with its addresses,
// which is what fills EndpointSlices.
func (w *podWorker) writeRunning(ctx context.Context, pod *corev1.Pod, sb *sandbox, started time.Time) error {
	node := w.m.node
	return retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		cur, err := w.m.cs.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cur.UID != pod.UID {
			return fmt.Errorf("pod was replaced")
		}
		now := metav1.Now()
		startTime := metav1.NewTime(started)
		s := &cur.Status
		s.Phase = corev1.PodRunning
		s.HostIP, s.HostIPs = node.Address, []corev1.HostIP{{IP: node.Address}}
		s.PodIP, s.PodIPs = sb.ips[0], nil
		for _, ip := range sb.ips {
			s.PodIPs = append(s.PodIPs, corev1.PodIP{IP: ip})
		}
		s.StartTime = &startTime
		s.Conditions = nil
		for _, t := range []corev1.PodConditionType{corev1.PodScheduled, "PodReadyToStartContainers", corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
			s.Conditions = append(s.Conditions, corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: now})
		}
		s.ContainerStatuses = nil
		started := true
		for _, c := range cur.Spec.Containers {
			s.ContainerStatuses = append(s.ContainerStatuses, corev1.ContainerStatus{
				Name: c.Name, Image: c.Image, ImageID: "tendril-lab://workload",
				ContainerID: "tendril-lab://" + sb.att.ContainerID, Ready: true, Started: &started,
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: startTime}},
			})
		}
		_, err = w.m.cs.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
}

// teardown stops the workload, runs CNI DEL and removes the namespace.
// Each step tolerates what is already gone, so it may run after a failed
// setup or twice.
func (w *podWorker) teardown() {
	sb := w.sandbox
	if sb == nil {
		return
	}
	w.sandbox = nil
	sb.stopping.Store(true)
	if sb.workload != nil && sb.workload.Process != nil {
		_ = sb.workload.Process.Kill()
		<-sb.exited
	}
	// DEL must not be skipped because the kubelet is shutting down: the
	// pod's address and endpoint would leak.
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := w.m.cni.del(ctx, sb.att)
		cancel()
		if err == nil {
			break
		}
		if attempt == 5 {
			w.log.Error("CNI DEL failed, giving up", "error", err)
			break
		}
		w.log.Warn("CNI DEL failed, retrying", "error", err, "attempt", attempt)
		time.Sleep(time.Duration(attempt) * 500 * time.Millisecond)
	}
	if sb.cgroup != "" {
		if err := lab.RemovePodCgroup(sb.cgroup); err != nil {
			w.log.Warn("Remove pod cgroup", "error", err)
		}
	}
	if err := lab.DeleteNetns(sb.netns); err != nil {
		w.log.Warn("Remove pod namespace", "error", err)
	}
	if err := w.m.st.RemovePod(sb.att.Namespace, sb.att.Name, sb.att.UID); err != nil {
		w.log.Warn("Remove pod record", "error", err)
	}
	w.log.Info("Pod stopped")
}

// finishDeletion removes a terminating pod from the API once its sandbox
// is gone, as the kubelet does at the end of graceful deletion.
func (w *podWorker) finishDeletion(ctx context.Context, pod *corev1.Pod) {
	zero := int64(0)
	uid := pod.UID
	err := w.m.cs.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		w.log.Warn("Finish pod deletion", "error", err)
		time.AfterFunc(time.Second, w.poke)
	}
}

// waitReadyFD reports the workload's readiness line on its pipe.
func (w *podWorker) waitReadyFD(pr *os.File, ready chan<- error) {
	buf := make([]byte, 16)
	n, err := pr.Read(buf)
	if n > 0 {
		err = nil
	} else if err == nil {
		err = errors.New("no readiness signal")
	}
	ready <- err
}

// isCoreDNS says whether the lab runs the pod's container as CoreDNS.
func isCoreDNS(pod *corev1.Pod) bool {
	return len(pod.Spec.Containers) == 1 && pod.Spec.Containers[0].Image == lab.CoreDNSImage
}

// waitCoreDNSReady polls CoreDNS's ready plugin inside the pod's network
// namespace until it answers 200, the process exits or wait passes.
func waitCoreDNSReady(sb *sandbox, wait time.Duration) error {
	url := "http://127.0.0.1:" + strconv.Itoa(lab.CoreDNSReadyPort) + "/ready"
	deadline := time.Now().Add(wait)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-sb.exited:
			return errors.New("CoreDNS exited")
		default:
		}
		var conn net.Conn
		err := lab.InNetns(lab.NetnsPath(sb.netns), func() error {
			var err error
			conn, err = net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(lab.CoreDNSReadyPort), time.Second)
			return err
		})
		if err == nil {
			client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true,
				DialContext: func(context.Context, string, string) (net.Conn, error) { return conn, nil }}}
			resp, err := client.Get(url)
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return nil
				}
				err = fmt.Errorf("%s: %s", url, resp.Status)
			}
			conn.Close()
			last = err
		} else {
			last = err
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("CoreDNS not ready after %s: %v", wait, last)
}
