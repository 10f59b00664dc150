// Package agent_test drives the tendril-agent and tendril binaries as real
// processes: start, CLI, signals, socket handling, config errors.
package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/cilium/api/v1/models"

	"github.com/tendril-net/tendril/pkg/client"
	"github.com/tendril-net/tendril/pkg/testutil/binaries"
)

var builder *binaries.Builder

func TestMain(m *testing.M) { os.Exit(binaries.Run(m, &builder)) }

type agentProc struct {
	cmd    *exec.Cmd
	socket string
	stderr *bytes.Buffer
}

func startAgent(t *testing.T, extraEnv []string, args ...string) *agentProc {
	t.Helper()
	bin, err := builder.Build("tendril-agent")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "t.sock")
	base := []string{"--state-dir", filepath.Join(dir, "state"), "--socket", sock,
		"--bpf-root", "/sys/fs/bpf/tendril-proc-" + filepath.Base(dir), "--prometheus-serve-addr", "", "--node-name", "proc-node", "--install-host-networking=false", "--enable-datapath=false", "--enable-health-checking=false"}
	cmd := exec.Command(bin, append(base, args...)...)
	cmd.Env = append(os.Environ(), extraEnv...)
	p := &agentProc{cmd: cmd, socket: sock, stderr: &bytes.Buffer{}}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return p
}

// waitServing polls the socket (never asserting a wall-clock bound: the
// deadline only keeps a broken agent from hanging the test).
func (p *agentProc) waitServing(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if _, _, code := runCLI(t, p.socket, "status", "--brief"); code == 0 {
			return
		}
		if p.cmd.ProcessState != nil {
			t.Fatalf("agent exited: %s", p.stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("agent not serving; stderr:\n%s", p.stderr)
}

func runCLI(t *testing.T, socket string, args ...string) (string, string, int) {
	t.Helper()
	bin, err := builder.Build("tendril")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, append([]string{"-H", "unix://" + socket}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

func TestCLIAgainstRealAgent(t *testing.T) {
	p := startAgent(t, nil)
	p.waitServing(t)

	out, _, code := runCLI(t, p.socket, "status", "--brief")
	if code != 0 || strings.TrimSpace(out) != "Ok" {
		t.Fatalf("status --brief = %q (exit %d)", out, code)
	}
	out, _, code = runCLI(t, p.socket, "status")
	for _, want := range []string{"Tendril:", "Ok", "Modules:", "api-server", "Bootstrap:", "proc-node"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("status lacks %q (exit %d):\n%s", want, code, out)
		}
	}
	out, _, code = runCLI(t, p.socket, "-o", "json", "status")
	var st map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st["cilium"] == nil {
		t.Fatalf("status -o json = %q (exit %d)", out, code)
	}
	out, _, code = runCLI(t, p.socket, "-o", "yaml", "config", "get")
	if code != 0 || !strings.Contains(out, "policy-enforcement: default") {
		t.Fatalf("config get -o yaml (exit %d):\n%s", code, out)
	}
	if _, errOut, code := runCLI(t, p.socket, "config", "set", "policy-enforcement=always", "debug=true"); code != 0 {
		t.Fatalf("config set failed (exit %d): %s", code, errOut)
	}
	out, _, _ = runCLI(t, p.socket, "config", "get")
	if !strings.Contains(out, "policy-enforcement") || !strings.Contains(out, "always") {
		t.Fatalf("config get after set:\n%s", out)
	}
	_, errOut, code := runCLI(t, p.socket, "config", "set", "state-dir=/elsewhere")
	if code == 0 || !strings.Contains(errOut, "403") {
		t.Fatalf("immutable set: exit %d, %s", code, errOut)
	}
	out, _, code = runCLI(t, p.socket, "version")
	if code != 0 || !strings.Contains(out, "Client:") || !strings.Contains(out, "Agent:") {
		t.Fatalf("version (exit %d): %s", code, out)
	}
	if out, _, code := runCLI(t, p.socket, "completion", "bash"); code != 0 || !strings.Contains(out, "bash completion") {
		t.Fatalf("completion bash (exit %d)", code)
	}

	// The raw API answers the spec's StatusResponse shape.
	hc := &http.Client{Transport: &http.Transport{Dial: func(_, _ string) (c netConn, err error) { return dialUnix(p.socket) }}}
	resp, err := hc.Get("http://x/v1/healthz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("content-type %q", resp.Header.Get("Content-Type"))
	}

	// SIGTERM stops the agent and removes its socket.
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("agent exit after SIGTERM: %v\n%s", err, p.stderr)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("agent did not stop after SIGTERM")
	}
	if _, err := os.Stat(p.socket); !os.IsNotExist(err) {
		t.Fatalf("socket left behind: %v", err)
	}
	_, _, code = runCLI(t, p.socket, "status", "--brief")
	if code == 0 {
		t.Fatal("status --brief exit 0 with no agent")
	}
}

func TestSecondAgentOnSameSocketRefuses(t *testing.T) {
	p := startAgent(t, nil)
	p.waitServing(t)
	bin, _ := builder.Build("tendril-agent")
	dir := t.TempDir()
	out, err := exec.Command(bin, "--state-dir", filepath.Join(dir, "s"), "--socket", p.socket,
		"--prometheus-serve-addr", "", "--node-name", "x", "--install-host-networking=false", "--enable-datapath=false", "--enable-health-checking=false").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "served by a running agent") {
		t.Fatalf("second agent: err %v, output %s", err, out)
	}
	if _, _, code := runCLI(t, p.socket, "status", "--brief"); code != 0 {
		t.Fatal("first agent disturbed by the second")
	}
}

func TestStaleSocketAfterKill(t *testing.T) {
	p := startAgent(t, nil)
	p.waitServing(t)
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
	if _, err := os.Stat(p.socket); err != nil {
		t.Fatalf("kill -9 should leave the socket file: %v", err)
	}
	// A new agent on the same socket replaces the stale file.
	bin, _ := builder.Build("tendril-agent")
	dir := t.TempDir()
	cmd := exec.Command(bin, "--state-dir", filepath.Join(dir, "s"), "--socket", p.socket, "--prometheus-serve-addr", "", "--node-name", "y", "--install-host-networking=false", "--enable-datapath=false", "--enable-health-checking=false")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	q := &agentProc{cmd: cmd, socket: p.socket, stderr: &stderr}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	q.waitServing(t)
}

func TestInvalidConfigStopsTheAgent(t *testing.T) {
	bin, err := builder.Build("tendril-agent")
	if err != nil {
		t.Fatal(err)
	}
	cfgDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(cfgDir, "mtu"), []byte("lots\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"env", []string{"TENDRIL_POLICY_ENFORCEMENT=sometimes"}, nil, "policy-enforcement"},
		{"config dir", nil, []string{"--config-dir", cfgDir}, "invalid value \"lots\" for mtu"},
		{"flag", nil, []string{"--log-format", "xml"}, "log-format"},
		{"env bool", []string{"TENDRIL_DEBUG=maybe"}, nil, "TENDRIL_DEBUG"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			args := append([]string{"--state-dir", filepath.Join(dir, "s"), "--socket", filepath.Join(dir, "t.sock"), "--prometheus-serve-addr", "", "--install-host-networking=false", "--enable-datapath=false", "--enable-health-checking=false"}, tt.args...)
			cmd := exec.Command(bin, args...)
			cmd.Env = append(os.Environ(), tt.env...)
			out, err := cmd.CombinedOutput()
			if err == nil || !strings.Contains(string(out), tt.want) {
				t.Fatalf("agent: err %v, output %s; want a message naming %s", err, out, tt.want)
			}
		})
	}
}

func TestConfigDirAndEnvApply(t *testing.T) {
	cfgDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(cfgDir, "policy-enforcement"), []byte("never"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfgDir, "mtu"), []byte("1400"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startAgent(t, []string{"TENDRIL_MTU=1450", "TENDRIL_CONFIG_DIR=" + cfgDir})
	p.waitServing(t)
	out, _, code := runCLI(t, p.socket, "-o", "json", "config", "get")
	if code != 0 {
		t.Fatalf("config get exit %d", code)
	}
	var cfg struct {
		Status struct {
			Map map[string]any `json:"daemonConfigurationMap"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(out), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Status.Map["policy-enforcement"] != "never" || cfg.Status.Map["mtu"] != "1450" {
		t.Fatalf("config dir / env not applied: %v %v", cfg.Status.Map["policy-enforcement"], cfg.Status.Map["mtu"])
	}
}

func TestJSONLogFormat(t *testing.T) {
	p := startAgent(t, nil, "--log-format", "json")
	p.waitServing(t)
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	_ = p.cmd.Wait()
	lines := strings.Split(strings.TrimSpace(p.stderr.String()), "\n")
	if len(lines) < 2 {
		t.Fatalf("too few log lines: %q", p.stderr.String())
	}
	for _, l := range lines {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil || rec["msg"] == nil || rec["level"] == nil {
			t.Fatalf("log line is not a JSON record: %q", l)
		}
	}
}

func TestCLIEndpointAndIPAM(t *testing.T) {
	p := startAgent(t, nil, "--ipv4-range", "10.66.0.0/24", "--ipv6-range", "none")
	p.waitServing(t)
	c, err := client.New("unix://" + p.socket)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	alloc, err := c.IPAMAllocate(ctx, "", "demo/web", true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.EndpointPut(ctx, "0", &models.EndpointChangeRequest{
		ContainerID: "cafe01", ContainerInterfaceName: "eth0", InterfaceName: "tdrcli0",
		K8sNamespace: "demo", K8sPodName: "web", SyncBuildEndpoint: true, Labels: models.Labels{"k8s:app=web"},
		Addressing: &models.AddressPair{IPV4: alloc.Address.IPV4, IPV4ExpirationUUID: alloc.IPV4.ExpirationUUID},
	}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args []string
		want []string
	}{
		{[]string{"endpoint", "list"}, []string{"ENDPOINT", "demo/web", "10.66.0.2", "ready"}},
		{[]string{"endpoint", "get", "pod-name:demo/web"}, []string{"Pod:", "demo/web", "cafe01:eth0", "k8s:app=web"}},
		{[]string{"endpoint", "log", "1"}, []string{"ready", "Completed endpoint regeneration"}},
		{[]string{"endpoint", "labels", "container-id:cafe01"}, []string{"k8s:app=web"}},
		{[]string{"ipam"}, []string{"10.66.0.2", "demo/web", "ipv4: 1/253 allocated from 10.66.0.0/24"}},
		{[]string{"status"}, []string{"IPAM:", "endpoints", "1 (1 ready)"}},
		{[]string{"-o", "json", "endpoint", "list"}, []string{`"pod-name": "demo/web"`}},
	}
	for _, tt := range tests {
		out, errOut, code := runCLI(t, p.socket, tt.args...)
		for _, w := range tt.want {
			if code != 0 || !strings.Contains(out, w) {
				t.Errorf("tendril %v (exit %d, %s) lacks %q:\n%s", tt.args, code, errOut, w, out)
			}
		}
	}
	if _, errOut, code := runCLI(t, p.socket, "endpoint", "get", "42"); code == 0 || !strings.Contains(errOut, "404") {
		t.Errorf("get of a missing endpoint: exit %d, %s", code, errOut)
	}
}

// fileStates is name → (inode, size, mtime) of every file under dir, for
// telling whether another process touched it.
func fileStates(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.Walk(dir, func(path string, fi os.FileInfo, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		st, _ := fi.Sys().(*syscall.Stat_t)
		var ino uint64
		if st != nil {
			ino = st.Ino
		}
		out[path] = fmt.Sprintf("ino=%d size=%d mtime=%s mode=%s", ino, fi.Size(), fi.ModTime().Format(time.RFC3339Nano), fi.Mode())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestSecondAgentOnSameStateDirRefuses: a second agent given the state
// directory of a running one (its own API socket, in the same directory,
// so the same hubble.sock; the same bpffs root) exits non-zero at its
// first start step with a message naming the directory and the first
// agent's PID, and touches nothing of the first: its state files, its
// sockets and its pins are as they were, and it still answers.
func TestSecondAgentOnSameStateDirRefuses(t *testing.T) {
	p := startAgent(t, nil)
	p.waitServing(t)
	dir := filepath.Dir(p.socket)
	stateDir := filepath.Join(dir, "state")
	bpfRoot := "/sys/fs/bpf/tendril-proc-" + filepath.Base(dir)
	// The agent's directory: its state, its API socket and (when the
	// datapath runs) its Hubble socket beside it.
	beforeDir, beforePins := fileStates(t, dir), fileStates(t, bpfRoot)

	bin, _ := builder.Build("tendril-agent")
	second := filepath.Join(dir, "second.sock")
	cmd := exec.Command(bin, "--state-dir", stateDir, "--socket", second, "--bpf-root", bpfRoot,
		"--prometheus-serve-addr", "", "--node-name", "proc-node", "--install-host-networking=false", "--enable-datapath=false", "--enable-health-checking=false")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		exited <- nil
	})
	// Either it exits, or it comes up serving (the bug); the deadline only
	// keeps a hung agent from hanging the test.
	var waitErr error
	deadline := time.Now().Add(60 * time.Second)
wait:
	for {
		select {
		case waitErr = <-exited:
			exited <- waitErr
			break wait
		default:
		}
		if _, _, code := runCLI(t, second, "status", "--brief"); code == 0 {
			t.Fatalf("a second agent on the same state dir came up serving; stderr:\n%s", stderr.String())
		}
		if time.Now().After(deadline) {
			t.Fatalf("second agent neither exited nor served; stderr:\n%s", stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if waitErr == nil {
		t.Fatalf("second agent exited 0; stderr:\n%s", stderr.String())
	}
	msg := stderr.String()
	if !strings.Contains(msg, stateDir) || !strings.Contains(msg, fmt.Sprintf("pid %d", p.cmd.Process.Pid)) {
		t.Errorf("second agent's error does not name the state dir %s and pid %d:\n%s", stateDir, p.cmd.Process.Pid, msg)
	}
	afterDir := fileStates(t, dir)
	delete(afterDir, second)
	if !maps.Equal(beforeDir, afterDir) {
		t.Errorf("the first agent's directory changed:\nbefore %v\nafter  %v", beforeDir, afterDir)
	}
	if afterPins := fileStates(t, bpfRoot); !maps.Equal(beforePins, afterPins) {
		t.Errorf("the first agent's pins changed:\nbefore %v\nafter  %v", beforePins, afterPins)
	}
	if _, _, code := runCLI(t, p.socket, "status", "--brief"); code != 0 {
		t.Fatal("first agent no longer answers")
	}
}
