package lab

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/tendril-net/tendril/pkg/controlplane"
	"github.com/tendril-net/tendril/pkg/freeport"
	"github.com/tendril-net/tendril/pkg/images"
	"github.com/tendril-net/tendril/pkg/lab/realnode"
)

// RuntimeContainerd is `lab up --runtime containerd`: each node is the
// upstream kubelet and containerd (package realnode) instead of the lab's
// own kubelet, and Tendril is installed with its Helm chart from the
// images of `make images`.
const RuntimeContainerd = "containerd"

// ValidateRuntime checks --runtime.
func ValidateRuntime(r string) error {
	if r != "" && r != RuntimeContainerd {
		return fmt.Errorf("--runtime %q: must be containerd or empty (the lab's own kubelet)", r)
	}
	return nil
}

// realNodeControllers are what kube-controller-manager runs besides the
// lab's default set when the nodes are real: the chart's DaemonSet and
// Deployments, and the kube-root-ca.crt ConfigMap of every namespace (a
// real kubelet mounts it in each pod's service-account token volume), and
// the node lifecycle controller (it lifts the not-ready taint a real
// kubelet registers its Node with, once the Node is Ready).
func realNodeControllers() []string {
	return []string{"root-ca-cert-publisher", "daemonset", "deployment", "replicaset", "nodelifecycle"}
}

// PauseBinary is the pod sandbox's binary, beside tendril in the bin dir.
const PauseBinary = "tendril-pause"

// realNodeCgroupRoot is the kubelet's cgroupRoot of a real node: the
// path of the lab's node cgroup (NodeCgroupDir) relative to the cgroup2
// mount, so the node's pods are under the cgroup its agent attaches
// socket load-balancing to; the same path is made in every v1 hierarchy.
func realNodeCgroupRoot(lab, node string) string {
	return "/" + filepath.Join(CgroupSubdir, lab, node)
}

// agentCgroupPath is where, in every real node's mount namespace, the
// node's cgroup v2 is bound: the chart's agent.cgroupRoot.
func agentCgroupPath(st *State) string { return filepath.Join(st.Dir, "node-cgroup") }

// realNode is the realnode view of a lab node.
func realNode(st *State, n Node, cgMount string) realnode.Node {
	return realnode.Node{
		Name:            n.Name,
		Dir:             filepath.Join(st.Dir, "nodes", n.Name),
		NetnsPath:       NetnsPath(n.Netns),
		Address:         n.Address,
		Address6:        n.Address6,
		Kubeconfig:      st.NodeKubeconfig,
		CgroupRoot:      realNodeCgroupRoot(st.Name, n.Name),
		BPFDir:          n.BPFRoot,
		Cgroup2Dir:      NodeCgroupDir(cgMount, st.Name, n.Name),
		AgentCgroupPath: agentCgroupPath(st),
		PauseImage:      realnode.PauseImageRef,
		ClusterDNS:      ClusterDNSIP,
		ClusterDomain:   ClusterDomain,
	}
}

// ensureNodeBinaries builds what is missing with hack/node-binaries.sh
// (of the source tree this program was built from).
func ensureNodeBinaries(out io.Writer) (realnode.Binaries, error) {
	b := realnode.BinariesIn(controlplane.BinaryDir())
	missing := b.Missing()
	if len(missing) == 0 {
		return b, nil
	}
	script := filepath.Join(repoRoot(), "hack", "node-binaries.sh")
	if _, err := os.Stat(script); err != nil {
		return b, fmt.Errorf("%s missing from %s, and no hack/node-binaries.sh to build them (run it from a Tendril checkout)", strings.Join(missing, ", "), controlplane.BinaryDir())
	}
	fmt.Fprintf(out, "==> building %s (hack/node-binaries.sh; minutes the first time)\n", strings.Join(missing, ", "))
	cmd := exec.Command(script)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		return b, fmt.Errorf("build the node binaries (hack/node-binaries.sh): %w", err)
	}
	if missing := b.Missing(); len(missing) > 0 {
		return b, fmt.Errorf("hack/node-binaries.sh ran, and still missing: %s", strings.Join(missing, ", "))
	}
	return b, nil
}

// imageArchives lists the OCI archives of dir (`make images`).
func imageArchives(dir string) ([]string, error) {
	archives, err := filepath.Glob(filepath.Join(dir, "*.tar"))
	if err != nil {
		return nil, err
	}
	if len(archives) == 0 {
		return nil, fmt.Errorf("no image archives in %s (make images, or --images-dir)", dir)
	}
	sort.Strings(archives)
	return archives, nil
}

// upRealNodes brings the real nodes up, after the control plane and the
// lab network: per node the API server proxy, containerd (the pause image
// and the Tendril images imported), the kubelet; then kube-scheduler; and
// waits for every Node to register with a pod CIDR.
func upRealNodes(ctx context.Context, cfg Config, st *State, cs kubernetes.Interface, exited map[string]<-chan error, out io.Writer, start time.Time) error {
	bins := realnode.BinariesIn(controlplane.BinaryDir())
	cgMount, err := Cgroup2Mount()
	if err != nil {
		return err
	}
	archives, err := imageArchives(cfg.ImagesDir)
	if err != nil {
		return err
	}
	pause := filepath.Join(st.Dir, "pause.tar")
	if err := realnode.WritePauseImage(filepath.Join(st.BinDir, PauseBinary), pause); err != nil {
		return err
	}
	coreDNS := filepath.Join(st.Dir, "coredns.tar")
	if err := WriteCoreDNSImage(st.CoreDNSBin, coreDNS); err != nil {
		return err
	}
	archives = append([]string{pause, coreDNS}, archives...)
	if err := os.MkdirAll(agentCgroupPath(st), 0o755); err != nil {
		return err
	}
	startRole := func(role string, argv []string) error {
		cmd, _, err := StartDetached(st.PidDir(), role, filepath.Join(st.LogDir(), role+".log"), argv)
		if err != nil {
			return err
		}
		exited[role] = watchExit(cmd)
		return nil
	}
	clientCA := filepath.Join(st.Dir, "pki", "ca.crt")
	for _, n := range st.Nodes {
		if err := startRole("node-proxy-"+n.Name, []string{filepath.Join(st.BinDir, "tendril"), "lab", "node-proxy", "--name", st.Name, "--node", n.Name}); err != nil {
			return err
		}
		rn := realNode(st, n, cgMount)
		if err := realnode.Prepare(ctx, rn, bins, clientCA); err != nil {
			return err
		}
		if err := startRole("containerd-"+n.Name, realnode.ContainerdArgv(rn, bins)); err != nil {
			return err
		}
	}
	for _, n := range st.Nodes {
		rn := realNode(st, n, cgMount)
		if err := realnode.WaitContainerd(ctx, rn, bins, 60*time.Second); err != nil {
			return err
		}
		if err := realnode.ImportImages(ctx, rn, bins, archives...); err != nil {
			return err
		}
	}
	step(out, start, "containerd: %d nodes, %d images imported into each", len(st.Nodes), len(archives))
	for _, n := range st.Nodes {
		if err := startRole("kubelet-"+n.Name, realnode.KubeletArgv(realNode(st, n, cgMount), bins)); err != nil {
			return err
		}
	}
	port, err := freeport.Loopback()
	if err != nil {
		return err
	}
	if err := startRole("kube-scheduler", []string{bins.Scheduler, "--kubeconfig", st.Kubeconfig,
		"--authentication-kubeconfig", st.Kubeconfig, "--authorization-kubeconfig", st.Kubeconfig,
		"--leader-elect=false", "--bind-address", "127.0.0.1", "--secure-port", strconv.Itoa(port)}); err != nil {
		return err
	}
	if err := waitNodesRegistered(ctx, cs, st, exited); err != nil {
		return err
	}
	step(out, start, "kubelets %s: %d Nodes registered, pod CIDRs assigned", realnode.KubeletVersion, len(st.Nodes))
	return nil
}

// sandboxCheckPod is a host-network pod of the pause image bound to a
// node: it runs through the kubelet, CRI and runc without CNI.
func sandboxCheckPod(node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "sandbox-check-" + node, Namespace: metav1.NamespaceDefault},
		Spec: corev1.PodSpec{
			NodeName:    node,
			HostNetwork: true,
			Containers: []corev1.Container{{Name: "pause", Image: realnode.PauseImageRef,
				ImagePullPolicy: corev1.PullNever}},
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
		},
	}
}

// upContainerd is the rest of Up for the containerd runtime.
func upContainerd(ctx context.Context, cfg Config, st *State, cs kubernetes.Interface, exited map[string]<-chan error, out io.Writer, start time.Time) error {
	if err := upRealNodes(ctx, cfg, st, cs, exited, out, start); err != nil {
		return err
	}
	if err := waitDefaultServiceAccount(ctx, cs, metav1.NamespaceDefault); err != nil {
		return err
	}
	// A pod sandbox on every node first: the kubelet, CRI, runc and the
	// pause image work before anything of Tendril is involved.
	for _, n := range st.Nodes {
		if _, err := cs.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, sandboxCheckPod(n.Name), metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create the sandbox check pod of %s: %w", n.Name, err)
		}
	}
	err := poll(ctx, "wait for the host-network pause pods", 2*time.Minute, st, exited, func() (bool, error) {
		for _, n := range st.Nodes {
			p, err := cs.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, sandboxCheckPod(n.Name).Name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			if p.Status.Phase != corev1.PodRunning {
				return false, fmt.Errorf("pod %s is %s", p.Name, p.Status.Phase)
			}
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	step(out, start, "pod sandboxes: a host-network pause pod runs on each of %d nodes", len(st.Nodes))
	tag, err := imageTag(cfg.ImagesDir)
	if err != nil {
		return err
	}
	st.WorkloadImage = images.DefaultRepository + "/workload:" + tag
	if err := st.Save(); err != nil {
		return err
	}
	if err := createHubbleTLSSecrets(ctx, cs, st); err != nil {
		return err
	}
	if err := installChart(ctx, cfg, st, out); err != nil {
		return err
	}
	step(out, start, "helm install tendril (chart %s, images %s) into %s; Hubble over mTLS, the lab's CA and a client certificate in %s", cmp.Or(cfg.ChartDir, chartDir()), tag, ChartNamespace, st.HubbleTLSDir())
	if err := waitAgentPods(ctx, cs, st, exited); err != nil {
		return err
	}
	step(out, start, "tendril-agent: a Ready pod on each of %d nodes, Nodes Ready", len(st.Nodes))
	if err := createLBPool(ctx, st); err != nil {
		return err
	}
	step(out, start, "load-balancer pool %s: %s, announced on the bridge (L2 announcements)", LBPoolName, LBPoolCIDR)
	if err := deployCoreDNSPods(ctx, cs, st); err != nil {
		return err
	}
	total := cfg.Nodes * cfg.PodsPerNode
	if total > 0 {
		for i := 1; i <= total; i++ {
			if _, err := cs.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, workloadPod(PodPrefix+strconv.Itoa(i), st.WorkloadImage), metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("create pod %s%d: %w", PodPrefix, i, err)
			}
		}
		if err := waitPodsReady(ctx, cs, total, out); err != nil {
			return err
		}
		step(out, start, "pods: %d running as containers of the workload image", total)
	}
	if err := waitClusterDNS(ctx, cs, st); err != nil {
		return err
	}
	step(out, start, "cluster DNS: CoreDNS (%s) on %d nodes behind %s/%s at %s", CoreDNSImageRef, len(dnsNodes(st)), DNSNamespace, DNSServiceName, ClusterDNSIP)
	fmt.Fprintf(out, "\nlab %s (runtime containerd) is up in %.1fs: tendril lab env prints how to reach it; tendril lab down removes it\n", st.Name, time.Since(start).Seconds())
	return nil
}

// downRealNodes removes what the real nodes of the named lab left once
// their recorded processes are gone: their containers (found by cgroup),
// mount namespaces and kubelet cgroups. A node is a real one when its
// directory holds a mount namespace file, so this needs no lab.json.
func downRealNodes(name string) (int, error) {
	dirs, err := filepath.Glob(filepath.Join(Dir(name), "nodes", "*"))
	if err != nil {
		return 0, err
	}
	var errs []error
	count := 0
	for _, d := range dirs {
		node := filepath.Base(d)
		rn := realnode.Node{Name: node, Dir: d, CgroupRoot: realNodeCgroupRoot(name, node)}
		if _, err := os.Stat(rn.MountNamespace()); err != nil {
			continue
		}
		if err := realnode.Teardown(rn); err != nil {
			errs = append(errs, err)
		}
		count++
	}
	if count > 0 {
		// The kubelets' cgroupRoots' parents in the v1 hierarchies, once
		// empty (another lab may still use <hierarchy>/tendril-lab).
		if hs, err := realnode.Hierarchies(); err == nil {
			for _, h := range hs {
				_ = os.Remove(filepath.Join(h.Mount, CgroupSubdir, name))
				_ = os.Remove(filepath.Join(h.Mount, CgroupSubdir))
			}
		}
	}
	return count, errors.Join(errs...)
}

// ChartNamespace is where the lab installs the chart.
const ChartNamespace = "kube-system"

// repoRoot is the source tree this program was built from (the chart and
// the hack scripts are there).
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

func chartDir() string { return filepath.Join(repoRoot(), "deploy", "helm", "tendril") }

// chartValues are the lab's values for the chart: the imported images
// (never pulled), the API server through each node's proxy (the agent
// and operator run on the host network before pod networking exists),
// each node's own cgroup (bound at one path in every node's mount
// namespace), Hubble with TLS between the relay and the agents (the
// chart's default) and at the relay for its clients, from the Secrets of
// createHubbleTLSSecrets; with --encryption wireguard, encryption.enabled.
// In a dual-stack lab the agents take the IPv6 pod CIDR each Node has
// beside its IPv4 one (their default ipv6-range, auto, defers to the
// Node's podCIDRs); otherwise IPv6 is off.
func chartValues(st *State, tag string) []string {
	operators := min(len(st.Nodes), 2)
	values := []string{
		"image.tag=" + tag,
		"image.pullPolicy=Never",
		"k8sServiceHost=127.0.0.1",
		"k8sServicePort=" + strconv.Itoa(NodeAPIPort),
		"agent.cgroupRoot=" + agentCgroupPath(st),
		"hubble.tls.enabled=true",
		"hubble.relay.tls.server.enabled=true",
		"operator.replicas=" + strconv.Itoa(operators),
		// The load-balancer addresses of the lab's pool answered on-link
		// (lbpool.go), as the default lab's agents do.
		"l2Announcements.enabled=true",
	}
	if !st.Dual() {
		// The lab network is IPv4 only (as the default lab's agents).
		values = append(values, "agent.extraConfig.ipv6-range=none")
	}
	if st.Encryption == "wireguard" {
		// Through the chart's values, as an operator would: the device
		// keeps the default name on every node (the TUN device is in
		// the node's network namespace, its socket in the node's own
		// /var/run/wireguard).
		values = append(values, "encryption.enabled=true")
	}
	return values
}

// imageTag is the tag of the agent image among the archives (make images
// tags every image with the same version).
func imageTag(imagesDir string) (string, error) {
	tmp, err := os.MkdirTemp("", "tendril-lab-image-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	a, err := images.ReadArchive(filepath.Join(imagesDir, "agent.tar"), tmp)
	if err != nil {
		return "", fmt.Errorf("read the agent image: %w", err)
	}
	i := strings.LastIndexByte(a.Ref, ':')
	if i < 0 || strings.Contains(a.Ref[i:], "/") {
		return "", fmt.Errorf("agent image %q has no tag", a.Ref)
	}
	return a.Ref[i+1:], nil
}

// installChart runs helm install of the chart against the lab's API
// server (helm from hack/helm.sh).
func installChart(ctx context.Context, cfg Config, st *State, out io.Writer) error {
	tag, err := imageTag(cfg.ImagesDir)
	if err != nil {
		return err
	}
	helmPath, err := exec.CommandContext(ctx, filepath.Join(repoRoot(), "hack", "helm.sh")).Output()
	if err != nil {
		return fmt.Errorf("helm (hack/helm.sh): %w", err)
	}
	argv := []string{"install", "tendril", cmp.Or(cfg.ChartDir, chartDir()), "--namespace", ChartNamespace, "--kubeconfig", st.Kubeconfig}
	for _, v := range chartValues(st, tag) {
		argv = append(argv, "--set", v)
	}
	cmd := exec.CommandContext(ctx, strings.TrimSpace(string(helmPath)), argv...)
	logf, err := os.OpenFile(filepath.Join(st.LogDir(), "helm.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "$ helm %s\n", strings.Join(argv, " "))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("helm install: %w; end of %s:\n%s", err, logf.Name(), logTail(logf.Name(), 20))
	}
	return nil
}

// waitAgentPods waits for a Ready agent pod on every node and every Node
// Ready (the kubelet reports it once the CNI configuration the agent's
// init container installs is there).
func waitAgentPods(ctx context.Context, cs kubernetes.Interface, st *State, exited map[string]<-chan error) error {
	return poll(ctx, "wait for the tendril-agent pods and the Nodes", 5*time.Minute, st, exited, func() (bool, error) {
		pods, err := cs.CoreV1().Pods(ChartNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=tendril-agent"})
		if err != nil {
			return false, err
		}
		ready := map[string]bool{}
		var why []string
		for i := range pods.Items {
			p := &pods.Items[i]
			if podReadyCondition(p) {
				ready[p.Spec.NodeName] = true
				continue
			}
			why = append(why, fmt.Sprintf("%s on %s: %s", p.Name, p.Spec.NodeName, podWaitReason(p)))
			// A container that keeps failing will not get better: its
			// log says why, now rather than at the deadline.
			if c, failed := failingContainer(p); failed {
				return false, &stopPolling{fmt.Errorf("agent pod %s on %s: container %s keeps failing; end of its log:\n%s",
					p.Name, p.Spec.NodeName, c, podLogTail(st, p, c, 15))}
			}
		}
		for _, n := range st.Nodes {
			if !ready[n.Name] {
				return false, fmt.Errorf("no Ready agent pod on %s (%s)", n.Name, strings.Join(why, "; "))
			}
			node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			if !nodeReady(node) {
				return false, fmt.Errorf("node %s is not Ready", n.Name)
			}
		}
		return true, nil
	})
}

func podReadyCondition(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podWaitReason says why a pod is not Ready yet, from its containers'
// states.
func podWaitReason(p *corev1.Pod) string {
	for _, cs := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		if w := cs.State.Waiting; w != nil {
			return cs.Name + " " + w.Reason + " " + w.Message
		}
		if t := cs.State.Terminated; t != nil && t.ExitCode != 0 {
			return fmt.Sprintf("%s exited %d %s", cs.Name, t.ExitCode, t.Reason)
		}
	}
	return string(p.Status.Phase)
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// failingContainer names a container of p in CrashLoopBackOff or that
// the runtime cannot create.
func failingContainer(p *corev1.Pod) (string, bool) {
	for _, cs := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		if w := cs.State.Waiting; w != nil && cs.RestartCount >= 2 &&
			(w.Reason == "CrashLoopBackOff" || w.Reason == "CreateContainerError" || w.Reason == "CreateContainerConfigError") {
			return cs.Name, true
		}
	}
	return "", false
}

// podLogTail is the end of a container's newest log, read from the
// node's pod log directory (the kubelet's podLogsDir).
func podLogTail(st *State, p *corev1.Pod, container string, lines int) string {
	dir := filepath.Join(st.Dir, "nodes", p.Spec.NodeName, "pod-logs",
		p.Namespace+"_"+p.Name+"_"+string(p.UID), container)
	logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	if len(logs) == 0 {
		return "(no log in " + dir + ")"
	}
	sort.Strings(logs)
	return logTail(logs[len(logs)-1], lines)
}

// workloadPod is a lab pod as a real container of image.
func workloadPod(name, image string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault, Labels: map[string]string{LabelApp: LabApp}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{WorkloadContainer(image)}},
	}
}

// WorkloadContainer is the workload as a real container (image: the
// workload image of `make images`, never pulled): its entrypoint
// (tendril-workload) answers on 80 and 81, TCP and UDP, with its pod's name
// (as the lab kubelet's pods do), Ready once it accepts on 80.
func WorkloadContainer(image string) corev1.Container {
	var ports []corev1.ContainerPort
	for _, p := range []int32{80, 81} {
		ports = append(ports, corev1.ContainerPort{ContainerPort: p, Protocol: corev1.ProtocolTCP},
			corev1.ContainerPort{ContainerPort: p, Protocol: corev1.ProtocolUDP})
	}
	return corev1.Container{
		Name:            "workload",
		Image:           image,
		ImagePullPolicy: corev1.PullNever,
		Args:            []string{"--pod-name", "$(POD_NAME)", "--tcp", "80,81", "--udp", "80,81"},
		Env: []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{
			FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
		Ports: ports,
		ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{
			TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(80)}}, PeriodSeconds: 2},
	}
}
