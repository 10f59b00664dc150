package helm

import (
	"bytes"
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

	"github.com/tendril-net/tendril/pkg/operator/status"
	"github.com/tendril-net/tendril/pkg/testutil"
	"github.com/tendril-net/tendril/pkg/testutil/binaries"
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
	c := newApplier(t, e)
	data, err := render(t, "--include-crds")
	if err != nil {
		t.Fatal(err)
	}
	objs := decode(t, data)
	c.createCRDs(t, objs)
	for _, ref := range []struct{ kind, name string }{
		{"ServiceAccount", "tendril-operator"}, {"ClusterRole", "tendril-operator"}, {"ClusterRoleBinding", "tendril-operator"},
		{"Role", "tendril-operator"}, {"RoleBinding", "tendril-operator"},
	} {
		c.apply(t, find(t, objs, ref.kind, ref.name))
	}

	// The token a pod of the ServiceAccount gets (TokenRequest), and the CA.
	tok, err := e.Clientset().CoreV1().ServiceAccounts(namespace).CreateToken(ctx, "tendril-operator",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(3600))}}, metav1.CreateOptions{})
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
	sa := t.TempDir()
	for name, b := range map[string][]byte{"token": []byte(tok.Status.Token), "ca.crt": ca, "namespace": []byte(namespace)} {
		if err := os.WriteFile(filepath.Join(sa, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	u, err := url.Parse(rc.Host)
	if err != nil {
		t.Fatal(err)
	}

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
	script := `mount -t tmpfs tmpfs /run && d=/run/secrets/kubernetes.io/serviceaccount && mkdir -p $d && cp "$0"/* $d/ && exec "$@"`
	cmd := exec.Command("unshare", append([]string{"--mount", "--propagation", "private", "--", "sh", "-c", script, sa, bin}, args...)...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "KUBERNETES_SERVICE_HOST=" + u.Hostname(), "KUBERNETES_SERVICE_PORT=" + u.Port()}
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := testutil.StartPinned(cmd); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("operator log:\n%s", logs.String())
		}
	})

	exited := false
	testutil.Eventually(t, 2*time.Minute, "the operator leading with its status ConfigMap written", func() bool {
		select {
		case <-done:
			exited = true
			return true
		default:
		}
		cm, err := e.Clientset().CoreV1().ConfigMaps(namespace).Get(ctx, status.ConfigMapName, metav1.GetOptions{})
		return err == nil && strings.HasPrefix(cm.Data[status.KeyHolder], podName)
	})
	if exited {
		t.Fatalf("the operator exited: %v\n%s", cmd.ProcessState, logs.String())
	}
	if strings.Contains(logs.String(), "forbidden") {
		t.Errorf("the operator was refused something its code needs:\n%s", logs.String())
	}
}

func ptr[T any](v T) *T { return &v }

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
