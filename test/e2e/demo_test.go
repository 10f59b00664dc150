package e2e_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/controlplane"
)

// TestPrivilegedDemoPolicyProbes runs the demo's policy step
// (hack/demo-policy.sh, what `make demo` runs) against the package's lab
// with the demo app: it passes with the policy, and fails, naming the
// mismatched probes, when the policy is deleted before its probes
// (TENDRIL_DEMO_DELETE_POLICY=1).
func TestPrivilegedDemoPolicyProbes(t *testing.T) {
	e := labUp(t)
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	kubectl := filepath.Join(controlplane.BinaryDir(), controlplane.KubectlBinary)
	e.createNamespace(t, "demo")
	t.Cleanup(func() {
		_ = e.cs.CoreV1().Namespaces().Delete(context.Background(), "demo", metav1.DeleteOptions{})
	})
	if out, err := exec.Command(kubectl, "--kubeconfig", e.st.Kubeconfig, "apply", "-f", filepath.Join(root, "examples/lab/demo-app.yaml")).CombinedOutput(); err != nil {
		t.Fatalf("kubectl apply demo-app.yaml: %v\n%s", err, out)
	}
	for _, pod := range []string{"backend", "frontend", "other", "far"} {
		e.waitReady(t, "demo", pod)
	}
	run := func(deletePolicy bool) (int, string) {
		cmd := exec.Command(filepath.Join(root, "hack/demo-policy.sh"))
		cmd.Env = append(os.Environ(), "TENDRIL="+tendrilBin, "TENDRIL_LAB="+labName)
		if deletePolicy {
			cmd.Env = append(cmd.Env, "TENDRIL_DEMO_DELETE_POLICY=1")
		}
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("run hack/demo-policy.sh: %v", err)
		}
		t.Logf("hack/demo-policy.sh (delete policy %v): exit %d\n%s", deletePolicy, code, out)
		return code, string(out)
	}
	if code, out := run(false); code != 0 || strings.Contains(out, "MISMATCH") {
		t.Fatalf("with the policy: exit %d, want 0 and no mismatch", code)
	}
	code, out := run(true)
	if code != 1 {
		t.Fatalf("with the policy deleted before the probes: exit %d, want 1", code)
	}
	for _, want := range []string{"other    -> backend:80/tcp", "connected, want blocked  MISMATCH", "did not match what the policy says"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
}
