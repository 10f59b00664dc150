package lab

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tendril-net/tendril/pkg/controlplane"
)

// TestEnvExportsKubectlWorksInScripts: after eval "$(tendril lab env)" a
// script (a non-interactive bash, which expands no alias) runs the lab's
// kubectl as `kubectl`, and a second eval changes nothing.
func TestEnvExportsKubectlWorksInScripts(t *testing.T) {
	k8sBin := t.TempDir()
	kubectl := filepath.Join(k8sBin, controlplane.KubectlBinary)
	if err := os.WriteFile(kubectl, []byte("#!/bin/sh\necho \"lab kubectl $KUBECONFIG $*\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	st := &State{Name: "t", Dir: t.TempDir(), K8sBinDir: k8sBin, Kubeconfig: "/lab/kubeconfig",
		Nodes: []Node{{Name: "node1", Socket: "/lab/node1.sock"}}}
	for range 2 {
		env, err := st.EnvExports()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(env, "alias") {
			t.Errorf("lab env defines an alias:\n%s", env)
		}
		script := env + "kubectl get pods\n"
		out, err := exec.Command("bash", "-c", script).CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "lab kubectl /lab/kubeconfig get pods" {
			t.Fatalf("a script after lab env: %v: %s\nenv:\n%s", err, out, env)
		}
	}
}

// TestEnvExportsWithoutKubectl: no kubectl built, no PATH entry.
func TestEnvExportsWithoutKubectl(t *testing.T) {
	st := &State{Name: "t", Dir: t.TempDir(), K8sBinDir: t.TempDir(), Kubeconfig: "/k"}
	env, err := st.EnvExports()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(env, "PATH") || !strings.Contains(env, "export KUBECONFIG=/k\n") {
		t.Errorf("env:\n%s", env)
	}
}
