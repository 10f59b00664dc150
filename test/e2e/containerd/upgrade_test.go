package containerd_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tendril-net/tendril/pkg/controlplane"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	tendrilclient "github.com/tendril-net/tendril/pkg/k8s/client/clientset/versioned"
	"github.com/tendril-net/tendril/pkg/lab"
	"github.com/tendril-net/tendril/pkg/lab/realnode"
	"github.com/tendril-net/tendril/pkg/policy/api"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// upgradeUnderTraffic runs `helm upgrade` of the lab's release, installed
// from the previous release's chart and images (hack/previous-release),
// to the chart and images of the tree under test (tag newTag, archives in
// newImagesDir) while a TCP stream (iperf3) and a ping every 10 ms (lab
// ping, on a fixed schedule) run from a pod on node2 to a pod on node1:
// the agent DaemonSet rolls node by node (maxUnavailable 1), and the
// stream must survive it unbroken and no ping may be lost; a pod the
// server's policy denies keeps trying and must never connect. Both run
// until the rollout is over: the stream for long enough, checked by order
// of events (it must still run when the rollout ends).
func upgradeUnderTraffic(t *testing.T, st *lab.State, tendril, newImagesDir, newTag string) {
	ctx := context.Background()
	cs, err := st.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	// The new images, imported into every node (no registry).
	archives, _ := filepath.Glob(filepath.Join(newImagesDir, "*.tar"))
	if len(archives) == 0 {
		t.Fatalf("no image archives in %s", newImagesDir)
	}
	ctr := realnode.BinariesIn(controlplane.BinaryDir()).Ctr
	for _, n := range st.Nodes {
		nd := realnode.Node{Name: n.Name, Dir: filepath.Join(st.Dir, "nodes", n.Name)}
		for _, a := range archives {
			out, err := exec.Command("nsenter", "--mount="+nd.MountNamespace(), "--net="+lab.NetnsPath(n.Netns),
				ctr, "--address", nd.ContainerdSocket(), "-n", "k8s.io", "images", "import", a).CombinedOutput()
			if err != nil {
				t.Fatalf("import %s into %s: %v\n%s", a, n.Name, err, out)
			}
		}
	}

	server, client, denied := "upgrade-server", "upgrade-client", "upgrade-denied"
	for name, node := range map[string]string{server: st.Nodes[0].Name, client: st.Nodes[1].Name, denied: st.Nodes[1].Name} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault, Labels: map[string]string{"app": name}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{lab.WorkloadContainer(st.WorkloadImage)}}}
		if _, err := cs.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	serverIP := ""
	poll(t, "the upgrade test's pods Ready", func() (bool, error) {
		for _, name := range []string{server, client, denied} {
			p, err := cs.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, name, metav1.GetOptions{})
			if err != nil || !lab.PodReady(p) {
				return false, err
			}
			if name == server {
				serverIP = p.Status.PodIP
			}
		}
		return true, nil
	})

	// The server admits the client only: the denied pod must never
	// connect, before, during or after the rollout.
	rc, err := controlplane.RESTConfig(st.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := tendrilclient.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	pol := &v1alpha1.TendrilNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "upgrade-server-admits-client", Namespace: metav1.NamespaceDefault},
		Spec: &api.Rule{
			EndpointSelector: &api.EndpointSelector{MatchLabels: map[string]string{"app": server}},
			Ingress:          []api.IngressRule{{FromEndpoints: []api.EndpointSelector{{MatchLabels: map[string]string{"app": client}}}}},
		},
	}
	if _, err := tc.TendrilV1alpha1().TendrilNetworkPolicies(metav1.NamespaceDefault).Create(ctx, pol, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	probe := func(from string) int {
		err := exec.Command(tendril, "lab", "probe", "--name", st.Name, "default/"+from, serverIP+":80", "--timeout", "500ms").Run()
		var ee *exec.ExitError
		switch {
		case err == nil:
			return 0
		case errors.As(err, &ee):
			return ee.ExitCode()
		}
		t.Fatalf("lab probe: %v", err)
		return -1
	}
	poll(t, "the policy to admit the client and drop the denied pod", func() (bool, error) {
		c, d := probe(client), probe(denied)
		return c == 0 && d == 1, fmt.Errorf("client probe exit %d, denied probe exit %d", c, d)
	})

	exec1 := func(pod string, argv ...string) (*exec.Cmd, *testutil.SyncBuffer) {
		out := &testutil.SyncBuffer{}
		cmd := exec.Command(tendril, append([]string{"lab", "exec", "--name", st.Name, "default/" + pod, "--"}, argv...)...)
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd, out
	}
	srv, srvOut := exec1(server, "iperf3", "-s", "-1", "-p", "5201", "--forceflush")
	defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	// The client retries until the server listens (its output is not
	// flushed before a test runs, so it cannot say when).
	var stream *exec.Cmd
	var streamOut *testutil.SyncBuffer
	var streamDone chan error
	poll(t, "the iperf3 stream to connect", func() (bool, error) {
		if stream == nil {
			stream, streamOut = exec1(client, "iperf3", "-c", serverIP, "-p", "5201", "-t", "150", "-i", "1", "--forceflush")
			streamDone = make(chan error, 1)
			go func(c *exec.Cmd, done chan error) { done <- c.Wait() }(stream, streamDone)
		}
		select {
		case err := <-streamDone:
			stream = nil // ended before it connected: try again
			return false, fmt.Errorf("iperf3 -c: %v: %s (server: %s)", err, streamOut.String(), srvOut.String())
		default:
		}
		return strings.Contains(streamOut.String(), "connected to"), nil
	})
	// 100 echo requests a second on a fixed schedule (lab ping: iputils
	// ping -i 0.01 sends only about 56 a second here).
	pingOut := &testutil.SyncBuffer{}
	ping := exec.Command(tendril, "lab", "ping", "--name", st.Name, "default/"+client, serverIP, "--interval", "10ms")
	ping.Stdout, ping.Stderr = pingOut, pingOut
	if err := ping.Start(); err != nil {
		t.Fatal(err)
	}

	helm, err := exec.Command(filepath.Join(moduleRoot(t), "hack", "helm.sh")).Output()
	if err != nil {
		t.Fatalf("hack/helm.sh: %v", err)
	}
	// The denied pod keeps trying throughout.
	stopDenied := make(chan struct{})
	deniedDone := make(chan [2]int, 1)
	go func() {
		tries, connected := 0, 0
		for {
			select {
			case <-stopDenied:
				deniedDone <- [2]int{tries, connected}
				return
			default:
			}
			tries++
			if err := exec.Command(tendril, "lab", "probe", "--name", st.Name, "default/"+denied, serverIP+":80", "--timeout", "500ms").Run(); err == nil {
				connected++
			}
		}
	}()
	begin := time.Now()
	out, err := exec.Command(strings.TrimSpace(string(helm)), "upgrade", "tendril", filepath.Join(moduleRoot(t), "deploy", "helm", "tendril"),
		"--namespace", lab.ChartNamespace, "--kubeconfig", st.Kubeconfig, "--reuse-values", "--set", "image.tag="+newTag).CombinedOutput()
	if err != nil {
		t.Fatalf("helm upgrade: %v\n%s", err, out)
	}
	waitRolledOut(t, cs, newTag)
	t.Logf("helm upgrade to %s: the agents and operators rolled out after %s", newTag, time.Since(begin).Round(time.Millisecond))
	select {
	case err := <-streamDone:
		t.Fatalf("the TCP stream ended before the rollout did (%v):\n%s", err, streamOut.String())
	default:
	}
	close(stopDenied)
	d := <-deniedDone
	t.Logf("the denied pod tried %d times during the upgrade, connected %d times", d[0], d[1])
	if d[0] == 0 || d[1] > 0 {
		t.Errorf("the denied pod connected %d of %d times during the upgrade", d[1], d[0])
	}
	_ = ping.Process.Signal(syscall.SIGINT)
	_ = stream.Process.Signal(syscall.SIGINT)
	_ = ping.Wait()
	<-streamDone
	t.Logf("ping:\n%s", pingOut.String())
	t.Logf("iperf3:\n%s", streamOut.String())
	m := regexp.MustCompile(`(\d+) packets transmitted, (\d+) received`).FindStringSubmatch(pingOut.String())
	if m == nil || m[1] != m[2] || m[1] == "0" {
		t.Errorf("pings lost during the upgrade (or no summary)")
	}
	// The rate and the longest gap are logged above, not judged: they
	// are the machine's timing (docs/install.md records them).
	// Every one-second interval of the stream moved data, and it ended
	// by our interrupt, not by a reset.
	var intervals [][]string
	interval := regexp.MustCompile(`^\[\s*\d+\]\s+([\d.]+)-([\d.]+)\s+sec\s+([\d.]+) (\w?)Bytes`)
	for _, line := range strings.Split(streamOut.String(), "\n") {
		if m := interval.FindStringSubmatch(line); m != nil && !strings.Contains(line, "sender") && !strings.Contains(line, "receiver") {
			intervals = append(intervals, m)
		}
	}
	if len(intervals) < 3 {
		t.Fatalf("too few iperf3 intervals")
	}
	minBytes, minAt := -1.0, ""
	for _, iv := range intervals[:len(intervals)-1] { // the last is the interrupted one
		v, _ := strconv.ParseFloat(iv[3], 64)
		v *= map[string]float64{"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[iv[4]]
		if minBytes < 0 || v < minBytes {
			minBytes, minAt = v, iv[1]+"-"+iv[2]
		}
	}
	t.Logf("the stream's slowest second: %.0f MBytes at %s s", minBytes/(1<<20), minAt)
	if minBytes == 0 {
		t.Errorf("the stream stalled for a whole second (%s s)", minAt)
	}
	if s := streamOut.String(); strings.Contains(s, "Connection reset") || strings.Contains(s, "unable to") || strings.Contains(s, "error") {
		t.Errorf("the stream broke")
	}
	// The restarted containers lost their health endpoints' namespaces
	// (mounted in the old containers' mount namespaces): each agent made
	// its endpoint again, and the other nodes probe it.
	healthEndpointsReachable(t, st, tendril)
}

// waitRolledOut waits for every agent pod to run the upgraded image,
// Ready, and the DaemonSet to count them all updated and available.
func waitRolledOut(t *testing.T, cs kubernetes.Interface, tag string) {
	ctx := context.Background()
	poll(t, "the agent DaemonSet and the operator Deployment to roll out", func() (bool, error) {
		ds, err := cs.AppsV1().DaemonSets(lab.ChartNamespace).Get(ctx, "tendril-agent", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		s := ds.Status
		if s.ObservedGeneration < ds.Generation || s.UpdatedNumberScheduled != s.DesiredNumberScheduled || s.NumberAvailable != s.DesiredNumberScheduled {
			return false, fmt.Errorf("agents: updated %d, available %d of %d", s.UpdatedNumberScheduled, s.NumberAvailable, s.DesiredNumberScheduled)
		}
		want := int(s.DesiredNumberScheduled)
		for _, app := range []string{"tendril-agent", "tendril-operator"} {
			pods, err := cs.CoreV1().Pods(lab.ChartNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + app})
			if err != nil {
				return false, err
			}
			running := 0
			for i := range pods.Items {
				p := &pods.Items[i]
				if p.DeletionTimestamp != nil {
					return false, fmt.Errorf("%s pod %s still terminating", app, p.Name)
				}
				if !strings.HasSuffix(p.Spec.Containers[0].Image, ":"+tag) || !lab.PodReady(p) {
					return false, fmt.Errorf("%s pod %s: %s ready=%v", app, p.Name, p.Spec.Containers[0].Image, lab.PodReady(p))
				}
				running++
			}
			if app == "tendril-agent" && running != want {
				return false, fmt.Errorf("%d agent pods of %d", running, want)
			}
			if running == 0 {
				return false, fmt.Errorf("no %s pod", app)
			}
		}
		return true, nil
	})
}

// poll retries cond; the deadline only keeps a broken lab from hanging
// the test.
func poll(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		ok, err := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s (last: %v)", what, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
