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

// TestEnvExportsContainerd: on real nodes the agents' sockets are the
// chart's, under each node's bound /var/run/tendril, and hubble gets the
// relay's TLS settings, not the own-kubelet lab's relay socket (which a
// containerd lab does not have).
func TestEnvExportsContainerd(t *testing.T) {
	dir := t.TempDir()
	nodeDir := filepath.Join(dir, "nodes", "node1")
	st := &State{Name: "t", Dir: dir, K8sBinDir: t.TempDir(), Kubeconfig: "/k", Runtime: RuntimeContainerd,
		Nodes: []Node{{Name: "node1", Netns: "tdr-t-node1", Socket: agentSocket(RuntimeContainerd, nodeDir)}}}
	env, err := st.EnvExports()
	if err != nil {
		t.Fatal(err)
	}
	want := "export TENDRIL_SOCK=unix://" + filepath.Join(nodeDir, "tendril-run", "tendril.sock") + "\n"
	if !strings.Contains(env, want) {
		t.Errorf("env lacks %q:\n%s", want, env)
	}
	ca, _, _ := st.HubbleClientTLS()
	for _, w := range []string{"HUBBLE_TLS=true", "HUBBLE_TLS_CA_CERT_FILES=" + ca, "HUBBLE_TLS_SERVER_NAME=" + RelayTLSServerName} {
		if !strings.Contains(env, w) {
			t.Errorf("env lacks %q:\n%s", w, env)
		}
	}
	if strings.Contains(env, st.RelaySocket()) {
		t.Errorf("env names the own-kubelet lab's relay socket:\n%s", env)
	}
	if _, err := exec.Command("bash", "-n", "-c", env).CombinedOutput(); err != nil {
		t.Errorf("env is not valid shell: %v\n%s", err, env)
	}
}
