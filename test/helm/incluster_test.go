package helm

import (
	"context"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"

	"github.com/tendril-net/tendril/pkg/operator/status"
	"github.com/tendril-net/tendril/pkg/testutil"
	"github.com/tendril-net/tendril/pkg/testutil/binaries"
	"github.com/tendril-net/tendril/pkg/testutil/k8senv"
)

// TestPrivilegedOperatorInCluster runs the real tendril-operator the way
// the chart's Deployment does: the chart's arguments, no kubeconfig,
// KUBERNETES_SERVICE_HOST/PORT and a token of its own ServiceAccount at the
// in-cluster path (a tmpfs over /run in a mount namespace of its own, as a
// pod has), with the chart's ServiceAccount, ClusterRole, Role and bindings
// created for real. It must take the leader Lease and write its status
// ConfigMap: client-go's in-cluster configuration and the chart's RBAC are
// enough for its start (a rule taken out of the Role fails this test).
func TestPrivilegedOperatorInCluster(t *testing.T) {
	testutil.Privileged(t)
	e := env.Need(t)
	ctx := context.Background()
	c, objs := chartWithCRDs(t, e)
	for _, ref := range []struct{ kind, name string }{
		{"ServiceAccount", "tendril-operator"}, {"ClusterRole", "tendril-operator"}, {"ClusterRoleBinding", "tendril-operator"},
		{"Role", "tendril-operator"}, {"RoleBinding", "tendril-operator"},
	} {
		c.apply(t, find(t, objs, ref.kind, ref.name))
	}

	sa := serviceAccountDir(t, e, "tendril-operator")
	bin, err := binaries.NewBuilder(t.TempDir()).Build("tendril-operator")
	if err != nil {
		t.Fatal(err)
	}
	dep := find(t, objs, "Deployment", "tendril-operator")
	cs, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
	args, _, _ := unstructured.NestedStringSlice(cs[0].(map[string]any), "args")
	const podName = "tendril-operator-test-0"
	for i, a := range args {
		// What the kubelet expands; and a port of the test's own (the
		// chart's is fixed, and this machine may have it taken).
		a = strings.ReplaceAll(a, "$(POD_NAME)", podName)
		if strings.HasPrefix(a, "--operator-api-serve-addr=") {
			a = "--operator-api-serve-addr=127.0.0.1:0"
		}
		args[i] = a
	}
	p := startInCluster(t, e, sa, bin, args, nil)

	p.eventually(t, "the operator leading with its status ConfigMap written", func() bool {
		cm, err := e.Clientset().CoreV1().ConfigMaps(namespace).Get(ctx, status.ConfigMapName, metav1.GetOptions{})
		return err == nil && strings.HasPrefix(cm.Data[status.KeyHolder], podName)
	})
	p.noForbidden(t)
}

// serviceAccountDir writes what the kubelet mounts at
// /var/run/secrets/kubernetes.io/serviceaccount for a pod of the
// ServiceAccount: a token from the TokenRequest API, the CA, the namespace.
func serviceAccountDir(t *testing.T, e *k8senv.Env, name string) string {
	t.Helper()
	tok, err := e.Clientset().CoreV1().ServiceAccounts(namespace).CreateToken(context.Background(), name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rc := e.RESTConfig()
	ca := rc.TLSClientConfig.CAData
	if len(ca) == 0 {
		if ca, err = os.ReadFile(rc.TLSClientConfig.CAFile); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	for file, b := range map[string][]byte{"token": []byte(tok.Status.Token), "ca.crt": ca, "namespace": []byte(namespace)} {
		if err := os.WriteFile(filepath.Join(dir, file), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// inCluster is a process started as in a pod (startInCluster).
type inCluster struct {
	cmd  *exec.Cmd
	logs *testutil.SyncBuffer
	done chan struct{}
}

// startInCluster runs bin with args and env the way a pod runs it: no
// kubeconfig, KUBERNETES_SERVICE_HOST/PORT of the API server, and the
// ServiceAccount's files (sa) at the in-cluster path, on a tmpfs over /run
// in a mount namespace of its own.
func startInCluster(t *testing.T, e *k8senv.Env, sa, bin string, args, env []string) *inCluster {
	t.Helper()
	u, err := url.Parse(e.RESTConfig().Host)
	if err != nil {
		t.Fatal(err)
	}
	script := `mount -t tmpfs tmpfs /run && d=/run/secrets/kubernetes.io/serviceaccount && mkdir -p $d && cp "$0"/* $d/ && exec "$@"`
	cmd := exec.Command("unshare", append([]string{"--mount", "--propagation", "private", "--", "sh", "-c", script, sa, bin}, args...)...)
	cmd.Env = append([]string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "KUBERNETES_SERVICE_HOST=" + u.Hostname(), "KUBERNETES_SERVICE_PORT=" + u.Port()}, env...)
	p := &inCluster{cmd: cmd, logs: &testutil.SyncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.logs, p.logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := testutil.StartPinned(cmd); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s log:\n%s", filepath.Base(bin), p.logs.String())
		}
	})
	return p
}

// eventually waits for cond, failing at once if the process exits.
func (p *inCluster) eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	exited := false
	testutil.Eventually(t, 2*time.Minute, what, func() bool {
		select {
		case <-p.done:
			exited = true
			return true
		default:
		}
		return cond()
	})
	if exited {
		t.Fatalf("exited before %s: %v", what, p.cmd.ProcessState)
	}
}

// noForbidden fails when the API server refused the process anything.
func (p *inCluster) noForbidden(t *testing.T) {
	t.Helper()
	if strings.Contains(p.logs.String(), "forbidden") {
		t.Errorf("refused something its code needs (see the log)")
	}
}

// apply creates o for real, or updates it to what was rendered.
func (a *applier) apply(t *testing.T, o *unstructured.Unstructured) {
	t.Helper()
	ctx := context.Background()
	gvk := o.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		t.Fatal(err)
	}
	ri := a.dyn.Resource(m.Resource).Namespace(o.GetNamespace())
	_, err = ri.Create(ctx, o, metav1.CreateOptions{FieldValidation: "Strict"})
	if apierrors.IsAlreadyExists(err) {
		cur, gerr := ri.Get(ctx, o.GetName(), metav1.GetOptions{})
		if gerr != nil {
			t.Fatal(gerr)
		}
		o = o.DeepCopy()
		o.SetResourceVersion(cur.GetResourceVersion())
		_, err = ri.Update(ctx, o, metav1.UpdateOptions{FieldValidation: "Strict"})
	}
	if err != nil {
		t.Fatalf("%s %s: %v", gvk.Kind, o.GetName(), err)
	}
}

// TestPrivilegedAgentInCluster runs the real tendril-agent as the chart's
// DaemonSet does: the chart's ConfigMap as its --config-dir, its node name
// from TENDRIL_NODE_NAME (the downward API's spec.nodeName in the
// DaemonSet), no kubeconfig, its ServiceAccount's token at the in-cluster
// path, under the chart's ClusterRole created for real. The test keeps the
// agent off this machine's kernel and uplink (flags beat the config
// directory): no datapath, no host networking, no listeners. It must find
// its Node, publish its TendrilNode and answer `tendril status --brief`
// (the chart's probe) with Ok, refused nothing by the API server.
func TestPrivilegedAgentInCluster(t *testing.T) {
	testutil.Privileged(t)
	e := env.Need(t)
	ctx := context.Background()
	c, objs := chartWithCRDs(t, e)
	for _, ref := range []struct{ kind, name string }{
		{"ServiceAccount", "tendril-agent"}, {"ClusterRole", "tendril-agent"}, {"ClusterRoleBinding", "tendril-agent"},
	} {
		c.apply(t, find(t, objs, ref.kind, ref.name))
	}
	const nodeName = "helm-node-a"
	node := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Node",
		"metadata": map[string]any{"name": nodeName}, "spec": map[string]any{"podCIDR": "10.251.0.0/24", "podCIDRs": []any{"10.251.0.0/24"}}}}
	c.apply(t, node)
	sa := serviceAccountDir(t, e, "tendril-agent")

	cm := find(t, objs, "ConfigMap", "tendril-config")
	values, _, _ := unstructured.NestedStringMap(cm.Object, "data")
	configDir := t.TempDir()
	for k, v := range values {
		if err := os.WriteFile(filepath.Join(configDir, k), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b := binaries.NewBuilder(t.TempDir())
	agentBin, err := b.Build("tendril-agent")
	if err != nil {
		t.Fatal(err)
	}
	cli, err := b.Build("tendril")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "tendril.sock")
	p := startInCluster(t, e, sa, agentBin, []string{
		"--config-dir=" + configDir,
		"--state-dir=" + filepath.Join(dir, "state"), "--socket=" + sock, "--bpf-root=/sys/fs/bpf/tendril-helm-test-unused",
		"--enable-datapath=false", "--install-host-networking=false", "--prometheus-serve-addr=",
		"--enable-masquerade=false", "--enable-node-port=false", "--enable-health-check-nodeport=false", "--cgroup-root=",
		"--enable-hubble=false", "--hubble-listen-address=",
		// In the machine's own namespace: no health port on its
		// addresses, and no probes to other Nodes' addresses.
		"--enable-health-checking=false",
	}, []string{"TENDRIL_NODE_NAME=" + nodeName})

	var last string
	p.eventually(t, "tendril status --brief Ok", func() bool {
		out, err := exec.Command(cli, "-H", "unix://"+sock, "status", "--brief").CombinedOutput()
		last = string(out)
		return err == nil && strings.TrimSpace(last) == "Ok"
	})
	if _, err := e.Clientset().CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	tn, err := c.dyn.Resource(tendrilNodesGVR).Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the agent published no TendrilNode %s (its node name from the environment): %v", nodeName, err)
	}
	t.Logf("TendrilNode %s written by the agent (resourceVersion %s); status: %s", tn.GetName(), tn.GetResourceVersion(), last)
	p.noForbidden(t)
}

var tendrilNodesGVR = schema.GroupVersionResource{Group: "tendril.io", Version: "v1alpha1", Resource: "tendrilnodes"}

// chartWithCRDs renders the default chart with its CRDs, creates the CRDs
// for real, and returns the applier and the chart's objects.
func chartWithCRDs(t *testing.T, e *k8senv.Env) (*applier, []*unstructured.Unstructured) {
	t.Helper()
	c := newApplier(t, e)
	data, err := render(t, "--include-crds")
	if err != nil {
		t.Fatal(err)
	}
	objs := decode(t, data)
	c.createCRDs(t, objs)
	return c, objs
}
