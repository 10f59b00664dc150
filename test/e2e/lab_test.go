// Package e2e_test runs Tendril end to end on the lab: one lab per test
// package (TestMain brings it up with `tendril lab up` and removes it with
// `tendril lab down`), real pods with real traffic, real agents, a real API
// server. Every test needs root.
package e2e_test

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/tendril-net/tendril/pkg/controlplane"
	"github.com/tendril-net/tendril/pkg/k8s"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/lab"
	"github.com/tendril-net/tendril/pkg/testutil"
	"github.com/tendril-net/tendril/pkg/testutil/binaries"
	"github.com/tendril-net/tendril/pkg/testutil/netpolmatrix"
)

// labName keeps the tests' lab apart from one a person runs (tdrlab);
// TENDRIL_E2E_LAB picks another, so two checkouts can run the suite side
// by side.
var labName = cmp.Or(os.Getenv("TENDRIL_E2E_LAB"), "tdre2e")

// Pods per node that `lab up` starts (default/pod-N).
const podsPerNode = 2

var (
	tendrilBin string
	upOutput   string
	// theLab is the package's lab, or labErr why there is none.
	theLab *env
	labErr error
)

// TestMain brings one lab up for every test of the package and removes it
// at the end, whatever the tests did.
func TestMain(m *testing.M) {
	// Started inside a pod by a test as a traffic client, not as tests.
	if spec := os.Getenv(udpStreamEnv); spec != "" {
		os.Exit(runUDPStream(spec))
	}
	netpolmatrix.RunProberIfAsked()
	if spec := os.Getenv(dnsLoadEnv); spec != "" {
		os.Exit(runDNSLoad(spec))
	}
	if spec := os.Getenv(httpLoadEnv); spec != "" {
		os.Exit(runHTTPLoad(spec))
	}
	binDir, err := os.MkdirTemp("", "tendril-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if os.Geteuid() == 0 {
		theLab, labErr = startLab(binDir)
	} else {
		labErr = errors.New("not root")
	}
	code := m.Run()
	if tendrilBin != "" {
		if out, err := exec.Command(tendrilBin, "lab", "--name", labName, "down").CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "tendril lab down: %v\n%s", err, out)
			code = 1
		}
	}
	_ = os.RemoveAll(binDir)
	os.Exit(code)
}

// env is the running lab, shared by the tests.
type env struct {
	st *lab.State
	cs kubernetes.Interface
	k8 *k8s.Clients
}

// labUp returns the package's lab, failing (CI) or skipping without one.
func labUp(t *testing.T) *env {
	t.Helper()
	testutil.Privileged(t)
	testutil.Require(t, labErr == nil, fmt.Sprintf("no lab: %v", labErr))
	return theLab
}

func startLab(dir string) (*env, error) {
	if _, err := controlplane.EnsureBinaries(os.Stderr); err != nil {
		return nil, err
	}
	b := binaries.NewBuilder(dir)
	for _, name := range []string{"tendril", "tendril-agent", "tendril-cni", "tendril-operator", lab.WorkloadBinary} {
		p, err := b.Build(name)
		if err != nil {
			return nil, err
		}
		// The lab wants them side by side.
		if filepath.Dir(p) != dir {
			if err := os.Symlink(p, filepath.Join(dir, name)); err != nil {
				return nil, err
			}
		}
	}
	tendrilBin = filepath.Join(dir, "tendril")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, tendrilBin, "lab", "up", "--name", labName, "--nodes", "2",
		"--pods-per-node", fmt.Sprint(podsPerNode), "--bin-dir", dir,
		// A BGP router in the world peering with every node (bgp_test.go).
		"--bgp",
		// Prometheus scraping every component (prometheus_test.go).
		"--prometheus").CombinedOutput()
	upOutput = string(out)
	if err != nil {
		return nil, fmt.Errorf("tendril lab up: %w\n%s", err, out)
	}
	st, err := lab.LoadState(labName)
	if err != nil {
		return nil, err
	}
	rc, err := controlplane.RESTConfig(st.Kubeconfig)
	if err != nil {
		return nil, err
	}
	clients, err := k8s.NewClientsForConfig(rc)
	if err != nil {
		return nil, err
	}
	return &env{st: st, cs: clients.Core, k8: clients}, nil
}

// tendril runs the CLI against the test lab and returns its exit code and
// combined output.
func tendril(t *testing.T, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(tendrilBin, append([]string{"lab", "--name", labName}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, out.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), out.String()
	}
	t.Fatalf("run tendril %v: %v", args, err)
	return -1, ""
}

// probe runs `tendril lab probe` and returns its exit code.
func probe(t *testing.T, from, addr string, udp bool) int {
	t.Helper()
	args := []string{"probe", from, addr, "--timeout", "1s"}
	if udp {
		args = append(args, "--udp")
	}
	code, out := tendril(t, args...)
	t.Logf("probe %s -> %s udp=%v: exit %d: %s", from, addr, udp, code, strings.TrimSpace(out))
	return code
}

// eventually retries cond; the deadline only keeps a broken lab from
// hanging the test.
func eventually(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ok, err := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s (last: %v)", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// labPod is a pod the lab kubelet runs (the workload answering on TCP
// and UDP 80 and 81), on node when one is named.
func labPod(ns, name, node string, labels map[string]string, ports ...corev1.ContainerPort) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "main", Image: "lab", Ports: ports}},
		},
	}
	if node != "" {
		pod.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": node}
	}
	return pod
}

func (e *env) createPod(t *testing.T, ns, name, node string, labels map[string]string, ports ...corev1.ContainerPort) {
	t.Helper()
	pod := labPod(ns, name, node, labels, ports...)
	if _, err := e.cs.CoreV1().Pods(ns).Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s/%s: %v", ns, name, err)
	}
}

// waitReady waits for a pod to run, Ready with an address, and returns it.
func (e *env) waitReady(t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	eventually(t, "pod "+ns+"/"+name+" ready", func() (bool, error) {
		p, err := e.cs.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pod = p
		return lab.PodReady(p), fmt.Errorf("phase %s", p.Status.Phase)
	})
	return pod
}

func (e *env) createNamespace(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	if _, err := e.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the default ServiceAccount of "+name, func() (bool, error) {
		_, err := e.cs.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, err
	})
}

func TestPrivilegedLabPodsRunning(t *testing.T) {
	e := labUp(t)
	pods, err := e.cs.CoreV1().Pods(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{LabelSelector: lab.LabelApp + "=" + lab.LabApp})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 2*podsPerNode {
		t.Fatalf("lab up made %d pods, want %d:\n%s", len(pods.Items), 2*podsPerNode, upOutput)
	}
	perNode := map[string]int{}
	for _, p := range pods.Items {
		if !lab.PodReady(&p) || len(p.Status.PodIPs) == 0 {
			t.Errorf("pod %s not running and ready with an address: %+v", p.Name, p.Status)
		}
		perNode[p.Spec.NodeName]++
	}
	if perNode["node1"] != podsPerNode || perNode["node2"] != podsPerNode {
		t.Errorf("pods per node %v, want %d on each (round robin)", perNode, podsPerNode)
	}
	nodes, err := e.cs.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		if len(n.Spec.PodCIDRs) == 0 || len(n.Status.Addresses) == 0 {
			t.Errorf("node %s lacks pod CIDRs or addresses: %+v %+v", n.Name, n.Spec, n.Status.Addresses)
		}
	}
	code, out := tendril(t, "env")
	if code != 0 || !strings.Contains(out, "KUBECONFIG="+e.st.Kubeconfig) || !strings.Contains(out, e.st.Nodes[1].Socket) {
		t.Errorf("lab env: exit %d:\n%s", code, out)
	}
}

func TestPrivilegedLabTraffic(t *testing.T) {
	e := labUp(t)
	const ns = "e2e-traffic"
	e.createNamespace(t, ns)
	udp53 := corev1.ContainerPort{ContainerPort: 53, Protocol: corev1.ProtocolUDP}
	tcp8080 := corev1.ContainerPort{ContainerPort: 8080, Protocol: corev1.ProtocolTCP}
	e.createPod(t, ns, "client", "node1", nil)
	e.createPod(t, ns, "server", "node1", nil, tcp8080, udp53)
	e.createPod(t, ns, "remote", "node2", nil)
	e.waitReady(t, ns, "client")
	server := e.waitReady(t, ns, "server")
	remote := e.waitReady(t, ns, "remote")

	t.Run("same node TCP and UDP on declared ports", func(t *testing.T) {
		if c := probe(t, ns+"/client", server.Status.PodIP+":8080", false); c != 0 {
			t.Errorf("TCP probe exit %d, want 0", c)
		}
		if c := probe(t, ns+"/client", server.Status.PodIP+":53", true); c != 0 {
			t.Errorf("UDP probe exit %d, want 0", c)
		}
		if c := probe(t, ns+"/client", server.Status.PodIP+":80", false); c != 1 {
			t.Errorf("TCP probe of an undeclared port exit %d, want 1 (refused)", c)
		}
	})
	t.Run("exec runs in the pod", func(t *testing.T) {
		code, out := tendril(t, "exec", ns+"/client", "--", "ip", "-4", "-o", "addr", "show", "dev", "eth0")
		client, _ := e.cs.CoreV1().Pods(ns).Get(context.Background(), "client", metav1.GetOptions{})
		if code != 0 || client == nil || !strings.Contains(out, client.Status.PodIP+"/32") {
			t.Errorf("lab exec: exit %d:\n%s", code, out)
		}
	})
	t.Run("cross node TCP, UDP and ICMP", func(t *testing.T) {
		// Needs the agents' node manager (routes to the peers' pod CIDRs).
		if c := probe(t, ns+"/client", remote.Status.PodIP+":80", false); c != 0 {
			t.Errorf("TCP probe exit %d, want 0", c)
		}
		if c := probe(t, ns+"/remote", server.Status.PodIP+":53", true); c != 0 {
			t.Errorf("UDP probe exit %d, want 0", c)
		}
		if c, out := tendril(t, "exec", ns+"/client", "--", "ping", "-c", "3", "-i", "0.2", "-W", "2", remote.Status.PodIP); c != 0 {
			t.Errorf("ping across nodes: exit %d\n%s", c, out)
		}
	})
}

func TestPrivilegedLabProbeExitCodes(t *testing.T) {
	e := labUp(t)
	var some string
	for _, p := range []string{"pod-1", "pod-2"} {
		pod := e.waitReady(t, metav1.NamespaceDefault, p)
		some = pod.Status.PodIP
	}
	for _, tc := range []struct {
		name string
		args []string
		want int
	}{
		{"no such pod", []string{"probe", "default/nope", some + ":80"}, 2},
		{"malformed address", []string{"probe", "default/pod-1", "nope"}, 2},
		{"unknown flag", []string{"probe", "default/pod-1", some + ":80", "--bogus"}, 2},
		{"missing argument", []string{"probe", "default/pod-1"}, 2},
		{"flags before arguments", []string{"probe", "--timeout", "2s", "--udp", "default/pod-1", some + ":81"}, 0},
		{"refused", []string{"probe", "default/pod-1", some + ":9"}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if code, out := tendril(t, tc.args...); code != tc.want {
				t.Errorf("tendril lab %v: exit %d, want %d:\n%s", tc.args, code, tc.want, out)
			}
		})
	}
	t.Run("many probes at once", func(t *testing.T) {
		const n = 8
		codes := make(chan int, n)
		for range n {
			go func() {
				cmd := exec.Command(tendrilBin, "lab", "--name", labName, "probe", "default/pod-1", some+":80")
				err := cmd.Run()
				var ee *exec.ExitError
				if errors.As(err, &ee) {
					codes <- ee.ExitCode()
					return
				}
				if err != nil {
					codes <- -1
					return
				}
				codes <- 0
			}()
		}
		for range n {
			if c := <-codes; c != 0 {
				t.Errorf("a concurrent probe exited %d", c)
			}
		}
	})
}

const policyYAML = `
apiVersion: tendril.io/v1alpha1
kind: TendrilNetworkPolicy
metadata:
  name: allow-frontend
spec:
  endpointSelector:
    matchLabels: {app: backend}
  ingress:
  - fromEndpoints:
    - matchLabels: {app: frontend}
    toPorts:
    - ports: [{port: "80", protocol: TCP}]
`

func TestPrivilegedLabPolicy(t *testing.T) {
	e := labUp(t)
	const ns = "e2e-policy"
	e.createNamespace(t, ns)
	// The frontend on the other node: the backend's node knows it by the
	// identity its node published (TendrilIdentity + TendrilEndpoint).
	for app, node := range map[string]string{"frontend": "node1", "backend": "node2", "other": "node2"} {
		e.createPod(t, ns, app, node, map[string]string{"app": app})
	}
	backend := e.waitReady(t, ns, "backend")
	e.waitReady(t, ns, "frontend")
	e.waitReady(t, ns, "other")
	addr80 := backend.Status.PodIP + ":80"
	for _, from := range []string{"frontend", "other"} {
		if c := probe(t, ns+"/"+from, addr80, false); c != 0 {
			t.Fatalf("before the policy: %s -> backend:80 exit %d, want 0", from, c)
		}
	}
	pol := &v1alpha1.TendrilNetworkPolicy{}
	if err := yaml.UnmarshalStrict([]byte(policyYAML), pol); err != nil {
		t.Fatal(err)
	}
	if _, err := e.k8.Tendril.TendrilV1alpha1().TendrilNetworkPolicies(ns).Create(context.Background(), pol, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "other -> backend:80 denied", func() (bool, error) {
		c := probe(t, ns+"/other", addr80, false)
		return c == 1, fmt.Errorf("exit %d", c)
	})
	if c := probe(t, ns+"/frontend", addr80, false); c != 0 {
		t.Errorf("frontend -> backend:80 exit %d, want 0 (allowed)", c)
	}
	if c := probe(t, ns+"/frontend", backend.Status.PodIP+":81", true); c != 1 {
		t.Errorf("frontend -> backend:81/udp exit %d, want 1 (not in the policy)", c)
	}
	if c := probe(t, ns+"/backend", e.waitReady(t, ns, "other").Status.PodIP+":80", false); c != 0 {
		t.Errorf("backend -> other:80 exit %d, want 0 (egress unrestricted)", c)
	}
}

func TestPrivilegedLabPodRecreate(t *testing.T) {
	e := labUp(t)
	const ns = "e2e-recreate"
	ctx := context.Background()
	e.createNamespace(t, ns)
	e.createPod(t, ns, "peer", "node1", nil)
	peer := e.waitReady(t, ns, "peer")
	e.createPod(t, ns, "again", "node1", nil)
	first := e.waitReady(t, ns, "again")
	firstRec, err := e.st.Pod(ns, "again")
	if err != nil {
		t.Fatal(err)
	}
	zero := int64(0)
	if err := e.cs.CoreV1().Pods(ns).Delete(ctx, "again", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	// Right away, as the issue asks: the kubelet tears down the old sandbox
	// while the new pod of the same name comes up.
	e.createPod(t, ns, "again", "node1", nil)
	second := e.waitReady(t, ns, "again")
	if second.UID == first.UID {
		t.Fatal("same UID after recreate")
	}
	eventually(t, "the old pod's namespace removed", func() (bool, error) {
		_, err := os.Stat(lab.NetnsPath(firstRec.Netns))
		return errors.Is(err, os.ErrNotExist), err
	})
	if c := probe(t, ns+"/peer", second.Status.PodIP+":80", false); c != 0 {
		t.Errorf("peer -> recreated pod exit %d, want 0", c)
	}
	if c := probe(t, ns+"/again", peer.Status.PodIP+":80", false); c != 0 {
		t.Errorf("recreated pod -> peer exit %d, want 0", c)
	}

	t.Run("graceful delete finishes", func(t *testing.T) {
		rec, err := e.st.Pod(ns, "again")
		if err != nil {
			t.Fatal(err)
		}
		if err := e.cs.CoreV1().Pods(ns).Delete(ctx, "again", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the pod gone from the API and its namespace removed", func() (bool, error) {
			_, err := e.cs.CoreV1().Pods(ns).Get(ctx, "again", metav1.GetOptions{})
			if !apierrors.IsNotFound(err) {
				return false, err
			}
			_, err = os.Stat(lab.NetnsPath(rec.Netns))
			return errors.Is(err, os.ErrNotExist), err
		})
	})
	t.Run("namespace deletion finishes", func(t *testing.T) {
		rec, err := e.st.Pod(ns, "peer")
		if err != nil {
			t.Fatal(err)
		}
		if err := e.cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "namespace "+ns+" gone", func() (bool, error) {
			_, err := e.cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
			return apierrors.IsNotFound(err), err
		})
		if _, err := os.Stat(lab.NetnsPath(rec.Netns)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("pod namespace %s still there after its namespace was deleted: %v", rec.Netns, err)
		}
	})
}
