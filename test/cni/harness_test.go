// Package cni_test drives CNI plugins (tendril-cni, and the stock cilium-cni)
// through libcni against a real tendril-agent process. Every test gets its
// own "node" network namespace; the agent and the plugins run inside it, so
// the host's own network namespace is never changed.
package cni_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/tendril-net/tendril/pkg/client"
	"github.com/tendril-net/tendril/pkg/testutil/binaries"
)

var builder *binaries.Builder

func TestMain(m *testing.M) { os.Exit(binaries.Run(m, &builder)) }

func randSuffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// addNetns creates a named network namespace and removes it at cleanup.
func addNetns(t testing.TB, name string) string {
	t.Helper()
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	return "/run/netns/" + name
}

// node is one "node": a network namespace with a tendril-agent in it and a
// libcni runtime that runs plugins inside that namespace.
type node struct {
	t       testing.TB
	name    string
	netns   string
	dir     string
	socket  string
	agent   *client.Client
	cmd     *exec.Cmd
	logs    *bytes.Buffer
	binDir  string
	cni     *libcni.CNIConfig
	cache   string
	nl      *netlink.Handle
	bpfRoot string
}

// startNode creates the namespace and starts the agent in it with extra
// flags. TENDRIL_TEST_AGENT may name another agent binary, and
// TENDRIL_TEST_AGENT_ARGS gives every agent the tests start more flags
// (before each test's own, which win), e.g. --datapath-attach-mode=tc to
// run the suite with the datapath attached as tc filters.
func startNode(t testing.TB, agentArgs ...string) *node {
	t.Helper()
	n := newNode(t)
	n.start(t, agentArgs...)
	return n
}

// newNode is a node without its agent yet: the namespace (loopback up), its
// directory, the plugin, and a client for the agent's socket.
func newNode(t testing.TB) *node {
	t.Helper()
	suffix := randSuffix()
	n := &node{t: t, name: "tdrcni-node-" + suffix, dir: t.TempDir(), logs: &bytes.Buffer{}}
	n.netns = addNetns(t, n.name)
	n.socket = filepath.Join(n.dir, "t.sock")
	n.bpfRoot = "/sys/fs/bpf/tendril-cni-" + suffix
	t.Cleanup(func() { _ = os.RemoveAll(n.bpfRoot) })

	cniBin, err := builder.Build("tendril-cni")
	if err != nil {
		t.Fatal(err)
	}
	n.binDir = filepath.Join(n.dir, "bin")
	if err := os.MkdirAll(n.binDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(cniBin, filepath.Join(n.binDir, "tendril-cni")); err != nil {
		t.Fatal(err)
	}
	if n.agent, err = client.New(n.socket); err != nil {
		t.Fatal(err)
	}
	// A node has its loopback up (an embedded etcd listens on it).
	if out, err := exec.Command("nsenter", "--net="+n.netns, "ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("loopback up in %s: %v: %s", n.name, err, out)
	}
	return n
}

// start runs the node's agent with extra flags and opens the node's netlink
// handle and CNI runtime.
func (n *node) start(t testing.TB, agentArgs ...string) {
	t.Helper()
	n.runAgent(t, agentArgs...)
	ns, err := netns.GetFromPath(n.netns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	if n.nl, err = netlink.NewHandleAt(ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.nl.Close() })
	n.cache = filepath.Join(n.dir, "cni-cache")
	n.cni = n.runtime(n.cache)
}

// runtime is a libcni runtime whose plugins run inside the node's netns.
// The plugins see CILIUM_SOCK, so the stock cilium-cni finds this node's
// agent too.
func (n *node) runtime(cacheDir string) *libcni.CNIConfig {
	return libcni.NewCNIConfigWithCacheDir([]string{n.binDir}, cacheDir,
		&nsExec{netns: n.netns, env: []string{"CILIUM_SOCK=" + n.socket}})
}

// nsExec runs CNI plugins inside a network namespace, as a container
// runtime on that node would run them: the plugin is started from an OS
// thread switched into the namespace (a child inherits its creating
// thread's namespace). No nsenter in between, so the benchmark measures
// the plugin, not an extra exec.
type nsExec struct {
	netns string
	env   []string
	// decoder decodes VERSION answers.
	decoder version.PluginDecoder
}

func (e *nsExec) ExecPlugin(ctx context.Context, pluginPath string, stdinData []byte, environ []string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	c := exec.CommandContext(ctx, pluginPath)
	c.Env = append(append([]string(nil), environ...), e.env...)
	c.Stdin = bytes.NewReader(stdinData)
	c.Stdout, c.Stderr = &stdout, &stderr
	errc := make(chan error, 1)
	go func() {
		// The thread is never unlocked: it exits with this goroutine
		// instead of going back to the scheduler in the pod's namespace.
		runtime.LockOSThread()
		ns, err := netns.GetFromPath(e.netns)
		if err != nil {
			errc <- err
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			errc <- fmt.Errorf("enter %s: %w", e.netns, err)
			return
		}
		errc <- c.Run()
	}()
	if err := <-errc; err != nil {
		perr := &types.Error{}
		if jerr := json.Unmarshal(stdout.Bytes(), perr); jerr != nil || (perr.Code == 0 && perr.Msg == "") {
			return nil, fmt.Errorf("plugin %s failed: %w: stdout %q stderr %q", pluginPath, err, stdout.String(), stderr.String())
		}
		return nil, perr
	}
	return stdout.Bytes(), nil
}

func (e *nsExec) FindInPath(plugin string, paths []string) (string, error) {
	return invoke.FindInPath(plugin, paths)
}

func (e *nsExec) Decode(jsonBytes []byte) (version.PluginInfo, error) {
	return e.decoder.Decode(jsonBytes)
}

// confList builds a network configuration list for plugin type typ.
func (n *node) confList(typ, cniVersion string, extra map[string]any) *libcni.NetworkConfigList {
	n.t.Helper()
	plugin := map[string]any{"type": typ, "agent-socket": n.socket}
	for k, v := range extra {
		plugin[k] = v
	}
	raw, err := json.Marshal(map[string]any{"cniVersion": cniVersion, "name": "tendril-test", "plugins": []any{plugin}})
	if err != nil {
		n.t.Fatal(err)
	}
	list, err := libcni.NetworkConfFromBytes(raw)
	if err != nil {
		n.t.Fatal(err)
	}
	return list
}

// pod is one pod's network namespace and its runtime attachment.
type pod struct {
	name, namespace string
	netns           string
	rt              *libcni.RuntimeConf
}

func (n *node) newPod(name string) *pod {
	n.t.Helper()
	suffix := randSuffix()
	p := &pod{name: name, namespace: "default", netns: addNetns(n.t, "tdrcni-pod-"+suffix)}
	p.rt = &libcni.RuntimeConf{
		ContainerID: "cid" + suffix + strings.Repeat("0", 56),
		NetNS:       p.netns,
		IfName:      "eth0",
		// As the kubelet sends them: IgnoreUnknown lets plugins that do
		// not know the pod arguments (the reference plugins) accept them.
		Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", p.namespace}, {"K8S_POD_NAME", name}},
	}
	return p
}

func (n *node) add(list *libcni.NetworkConfigList, p *pod) (*current.Result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := n.cni.AddNetworkList(ctx, list, p.rt)
	if err != nil {
		return nil, err
	}
	return current.NewResultFromResult(res)
}

func (n *node) mustAdd(list *libcni.NetworkConfigList, p *pod) *current.Result {
	n.t.Helper()
	res, err := n.add(list, p)
	if err != nil {
		n.t.Fatalf("ADD %s: %v", p.name, err)
	}
	return res
}

func (n *node) del(list *libcni.NetworkConfigList, p *pod) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return n.cni.DelNetworkList(ctx, list, p.rt)
}

func (n *node) check(list *libcni.NetworkConfigList, p *pod) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return n.cni.CheckNetworkList(ctx, list, p.rt)
}

// hostVeths lists the node's pod veths (tendril-cni's "tdr" and
// cilium-cni's "lxc" prefixes).
func (n *node) hostVeths() []string {
	n.t.Helper()
	links, err := n.nl.LinkList()
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		n.t.Fatal(err)
	}
	var out []string
	for _, l := range links {
		if name := l.Attrs().Name; l.Type() == "veth" && (strings.HasPrefix(name, "tdr") || strings.HasPrefix(name, "lxc")) {
			out = append(out, name)
		}
	}
	return out
}

func (n *node) endpoints() []*models.Endpoint {
	n.t.Helper()
	eps, err := n.agent.EndpointList(context.Background())
	if err != nil {
		n.t.Fatal(err)
	}
	return eps
}

// endpointOf is the ID of the pod's endpoint.
func (n *node) endpointOf(p *pod) int64 {
	n.t.Helper()
	for _, ep := range n.endpoints() {
		if ep.Status != nil && ep.Status.ExternalIdentifiers != nil && ep.Status.ExternalIdentifiers.ContainerID == p.rt.ContainerID {
			return ep.ID
		}
	}
	n.t.Fatalf("no endpoint of pod %s (container %s)", p.name, p.rt.ContainerID)
	return 0
}

// podAllocations are the agent's IPAM allocations held for pods: every
// allocation except the router's, from the status' ipam section.
func (n *node) podAllocations() map[string]string {
	n.t.Helper()
	var st models.StatusResponse
	if err := n.agent.Do(context.Background(), "GET", "/healthz", nil, nil, nil, &st); err != nil {
		n.t.Fatal(err)
	}
	if st.Ipam == nil {
		n.t.Fatal("agent's /v1/healthz has no ipam section: cannot tell whether addresses leaked")
	}
	out := map[string]string{}
	for ip, owner := range st.Ipam.Allocations {
		if owner != "router" {
			out[ip] = owner
		}
	}
	return out
}

// assertClean fails unless the node has no pod veth, no endpoint with a
// container and no pod allocation left.
func (n *node) assertClean(what string) {
	n.t.Helper()
	if v := n.hostVeths(); len(v) != 0 {
		n.t.Errorf("%s left veths behind: %v", what, v)
	}
	for _, ep := range n.endpoints() {
		if ep.Status != nil && ep.Status.ExternalIdentifiers != nil && ep.Status.ExternalIdentifiers.ContainerID != "" {
			n.t.Errorf("%s left endpoint %d (container %s) behind", what, ep.ID, ep.Status.ExternalIdentifiers.ContainerID)
		}
	}
	if a := n.podAllocations(); len(a) != 0 {
		n.t.Errorf("%s left allocations behind: %v", what, a)
	}
}

// inNetns runs a command inside a network namespace.
func inNetns(path string, name string, args ...string) ([]byte, error) {
	return exec.Command("nsenter", append([]string{"--net=" + path, name}, args...)...).CombinedOutput()
}

// ping sends echo requests from a pod to ip until one is answered, for up
// to ten seconds: the first packets may wait for neighbor resolution, and a
// plugin that leaves duplicate address detection on (the stock cilium-cni)
// has a tentative IPv6 address for a second or two after ADD.
func ping(from *pod, ip string) error {
	var out []byte
	var err error
	for range 10 {
		if out, err = inNetns(from.netns, "ping", "-c", "1", "-W", "1", ip); err == nil {
			return nil
		}
	}
	return fmt.Errorf("ping %s from %s: %w: %s", ip, from.name, err, out)
}

// cniCode is the CNI error code of err, failing when err is no CNI error.
func cniCode(t testing.TB, err error) uint {
	t.Helper()
	var te *types.Error
	if !errors.As(err, &te) {
		t.Fatalf("error %v (%T) is not a CNI error", err, err)
	}
	return te.Code
}

// runAgent starts tendril-agent inside the node's netns on the node's
// state dir, socket and BPF root (again after a kill, for restart tests)
// and waits until it serves.
func (n *node) runAgent(t testing.TB, agentArgs ...string) {
	t.Helper()
	agentBin := os.Getenv("TENDRIL_TEST_AGENT")
	if agentBin == "" {
		var err error
		if agentBin, err = builder.Build("tendril-agent"); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"--net=" + n.netns, agentBin,
		"--state-dir", filepath.Join(n.dir, "state"), "--socket", n.socket,
		"--bpf-root", n.bpfRoot, "--prometheus-serve-addr", "", "--node-name", n.name,
		// The health endpoint (on by default) is one more endpoint, veth
		// and allocation beside the pods these tests count; it has tests
		// of its own (pkg/agent/nodehealth, test/e2e).
		"--enable-endpoint-health-checking=false"}
	args = append(args, strings.Fields(os.Getenv("TENDRIL_TEST_AGENT_ARGS"))...)
	args = append(args, agentArgs...)
	cmd := exec.Command("nsenter", args...)
	cmd.Stdout, cmd.Stderr = n.logs, n.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	n.cmd = cmd
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("agent log of %s:\n%s", n.name, n.logs)
		}
	})
	// The deadline only keeps a broken agent from hanging the test.
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := n.agent.ConfigGet(ctx)
		cancel()
		if err == nil {
			return
		}
		select {
		case <-exited:
			t.Fatalf("agent exited: %v\n%s", cmd.ProcessState, n.logs)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent not serving after 60s: %v\n%s", err, n.logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
