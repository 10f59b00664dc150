package containerd_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/client"
	"github.com/tendril-net/tendril/pkg/lab"
	"github.com/tendril-net/tendril/pkg/lab/realnode"
	"github.com/tendril-net/tendril/pkg/testutil"
	"github.com/tendril-net/tendril/pkg/testutil/rawcap"
)

// wgPort is the WireGuard device's UDP port (the chart's default).
const wgPort = 51871

// TestPrivilegedLabContainerdWireGuard installs the chart with
// encryption on (encryption.enabled, through `lab up --encryption
// wireguard`) on two real kubelet+containerd nodes: pods on the two nodes
// exchange TCP and a capture on both nodes' bridge ports sees only
// WireGuard datagrams between the node addresses. Then, each under a ping
// every 10 ms from node2's pod to node1's with both bridge ports
// captured: node2's agent process is killed (SIGKILL: its container
// exits, the kubelet starts it again; the device runs on in the pod's
// wireguard-device container, the same process: at most one ping, the one
// in flight when ping stops, may go unanswered); helm upgrade turns strict
// mode on (both agent pods replaced one by one, device containers too:
// the persistent TUN links keep their routes, so no packet of a pod
// leaves in the clear while no process reads them; the pings lost are
// logged); node2's agent is killed again under strict mode.
func TestPrivilegedLabContainerdWireGuard(t *testing.T) {
	testutil.Privileged(t)
	binDir, imagesDir := buildLab(t)
	tendril := filepath.Join(binDir, "tendril")
	name := labName + "wg"
	down := func() (string, error) {
		out, err := exec.Command(tendril, "lab", "down", "--name", name).CombinedOutput()
		return string(out), err
	}
	t.Cleanup(func() {
		if out, err := down(); err != nil {
			t.Errorf("lab down: %v\n%s", err, out)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	begin := time.Now()
	out, err := exec.CommandContext(ctx, tendril, "lab", "up", "--name", name, "--runtime", lab.RuntimeContainerd,
		"--nodes", "2", "--pods-per-node", "0", "--encryption", "wireguard", "--bin-dir", binDir, "--images-dir", imagesDir).CombinedOutput()
	t.Logf("tendril lab up --runtime containerd --encryption wireguard (%s):\n%s", time.Since(begin).Round(time.Millisecond), out)
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	st, err := lab.LoadState(name)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := st.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	n1, n2 := st.Nodes[0], st.Nodes[1]
	nodeAddrs := map[netip.Addr]bool{netip.MustParseAddr(n1.Address): true, netip.MustParseAddr(n2.Address): true}
	inNode := func(n lab.Node, argv ...string) (string, error) {
		nd := realnode.Node{Name: n.Name, Dir: filepath.Join(st.Dir, "nodes", n.Name)}
		out, err := exec.Command("nsenter", append([]string{"--mount=" + nd.MountNamespace(), "--net=" + lab.NetnsPath(n.Netns), "--"}, argv...)...).CombinedOutput()
		return string(out), err
	}

	// The chart's values reached the agents: each node has the device,
	// persistent, and routes the other's pod CIDR to it.
	for _, n := range st.Nodes {
		out, err := inNode(n, "ip", "-d", "link", "show", "dev", "tendril_wg")
		if err != nil || !strings.Contains(out, "persist on") {
			t.Fatalf("%s: the device tendril_wg, want a persistent TUN: %v\n%s", n.Name, err, out)
		}
		out, err = inNode(n, "ip", "-4", "route", "show", "dev", "tendril_wg")
		if err != nil || strings.TrimSpace(out) == "" {
			t.Fatalf("%s: no route to tendril_wg: %v\n%s", n.Name, err, out)
		}
	}

	server, clientPod := "wg-server", "wg-client"
	for pod, node := range map[string]string{server: n1.Name, clientPod: n2.Name} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: metav1.NamespaceDefault, Labels: map[string]string{"app": pod}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{lab.WorkloadContainer(st.WorkloadImage)}}}
		if _, err := cs.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	podIPs := map[string]string{}
	poll(t, "the WireGuard test's pods Ready", func() (bool, error) {
		for _, pod := range []string{server, clientPod} {
			p, err := cs.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, pod, metav1.GetOptions{})
			if err != nil || !lab.PodReady(p) {
				return false, err
			}
			podIPs[pod] = p.Status.PodIP
		}
		return true, nil
	})
	pods := map[netip.Addr]string{}
	for pod, ip := range podIPs {
		pods[netip.MustParseAddr(ip)] = pod
	}
	probe := func() error {
		out, err := exec.Command(tendril, "lab", "probe", "--name", name, "default/"+clientPod, podIPs[server]+":80", "--timeout", "1s").CombinedOutput()
		if err != nil {
			return fmt.Errorf("lab probe: %v: %s", err, out)
		}
		return nil
	}
	// wire sorts the frames of both bridge ports: WireGuard datagrams
	// between the node addresses, and any frame to or from a pod.
	wire := func(t *testing.T, frames [][]byte) (wg int, clear []string) {
		for _, f := range frames {
			if len(f) < 34 || binary.BigEndian.Uint16(f[12:]) != unix.ETH_P_IP {
				continue
			}
			ip := f[14:]
			src, dst := netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
			if pods[src] != "" || pods[dst] != "" {
				clear = append(clear, fmt.Sprintf("%s -> %s protocol %d", src, dst, ip[9]))
				continue
			}
			ihl := int(ip[0]&0xf) * 4
			if ip[9] == unix.IPPROTO_UDP && len(ip) >= ihl+4 && binary.BigEndian.Uint16(ip[ihl+2:]) == wgPort {
				if !nodeAddrs[src] || !nodeAddrs[dst] {
					t.Errorf("WireGuard datagram %s -> %s, want between the nodes", src, dst)
				}
				wg++
			}
		}
		return wg, clear
	}

	t.Run("TCP between pods on two nodes, only WireGuard on the wire", func(t *testing.T) {
		caps := captureBridgePorts(t, st)
		poll(t, "wg-client to reach wg-server across nodes", func() (bool, error) { err := probe(); return err == nil, err })
		for i := 0; i < 5; i++ {
			if err := probe(); err != nil {
				t.Errorf("probe %d: %v", i, err)
			}
		}
		wg, clear := wire(t, caps())
		if len(clear) > 0 {
			t.Errorf("%d frames of a pod in the clear on the bridge ports: %s", len(clear), strings.Join(clear[:min(len(clear), 10)], "; "))
		}
		if wg == 0 {
			t.Fatal("no WireGuard datagram between the nodes on the bridge ports")
		}
		t.Logf("%d WireGuard datagrams between the nodes, no frame of a pod", wg)
	})

	ifindex := func(t *testing.T, n lab.Node) string {
		t.Helper()
		// ip, not /sys/class/net: nsenter keeps the machine's sysfs.
		out, err := inNode(n, "ip", "-o", "link", "show", "dev", "tendril_wg")
		idx, _, ok := strings.Cut(out, ":")
		if err != nil || !ok {
			t.Fatalf("%s's tendril_wg: %v: %s", n.Name, err, out)
		}
		return idx
	}
	// underTraffic runs restart while node2's pod pings node1's every 10
	// ms and both bridge ports are captured: no frame of a pod may be on
	// the wire, the devices keep their ifindex (the same persistent
	// links), and traffic flows through them again after. With maxLost
	// >= 0 at most that many pings may go unanswered (-1: logged only).
	underTraffic := func(t *testing.T, maxLost int, restart func(t *testing.T)) {
		oldIndex := map[string]string{}
		for _, n := range st.Nodes {
			oldIndex[n.Name] = ifindex(t, n)
		}
		counts := map[string]map[string]uint64{}
		for _, n := range st.Nodes {
			counts[n.Name] = datapathCounts(t, tendril, inNode, n)
		}
		caps := captureBridgePorts(t, st)
		pingOut := &testutil.SyncBuffer{}
		ping := exec.Command(tendril, "lab", "ping", "--name", name, "default/"+clientPod, podIPs[server], "--interval", "10ms")
		ping.Stdout, ping.Stderr = pingOut, pingOut
		if err := ping.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		begin := time.Now()
		restart(t)
		restarted := time.Since(begin)
		poll(t, "traffic through the devices again", func() (bool, error) { err := probe(); return err == nil, err })
		flowing := time.Since(begin)
		time.Sleep(2 * time.Second)
		_ = ping.Process.Signal(syscall.SIGINT)
		_ = ping.Wait()
		frames := caps()
		t.Logf("restarted and Ready after %s, a probe through after %s", restarted.Round(time.Millisecond), flowing.Round(time.Millisecond))
		t.Logf("ping across the restart:\n%s", pingOut.String())
		if m := regexp.MustCompile(`(\d+) packets transmitted, (\d+) received`).FindStringSubmatch(pingOut.String()); m == nil || m[1] == "0" {
			t.Errorf("no ping summary")
		} else {
			sent, got := atoi(m[1]), atoi(m[2])
			t.Logf("pings: %d sent, %d answered, %d lost", sent, got, sent-got)
			if got == 0 {
				t.Errorf("no ping answered")
			}
			if maxLost >= 0 && sent-got > maxLost {
				t.Errorf("%d of %d pings lost, want at most %d", sent-got, sent, maxLost)
			}
		}
		// What the datapaths counted meanwhile (drops by reason among
		// them): where a lost ping went.
		for _, n := range st.Nodes {
			var changed []string
			for k, v := range datapathCounts(t, tendril, inNode, n) {
				if d := v - counts[n.Name][k]; d > 0 {
					changed = append(changed, fmt.Sprintf("%s +%d", k, d))
				}
			}
			slices.Sort(changed)
			t.Logf("%s's datapath counted: %s", n.Name, strings.Join(changed, "; "))
		}
		wg, clear := wire(t, frames)
		t.Logf("%d frames on the bridge ports, %d WireGuard datagrams between the nodes, %d of a pod", len(frames), wg, len(clear))
		if len(clear) > 0 {
			t.Errorf("%d frames of a pod in the clear on the bridge ports: %s", len(clear), strings.Join(clear[:min(len(clear), 10)], "; "))
		}
		for _, n := range st.Nodes {
			if idx := ifindex(t, n); idx != oldIndex[n.Name] {
				t.Errorf("%s's tendril_wg ifindex %s, was %s: the device was made again", n.Name, idx, oldIndex[n.Name])
			}
		}
		out, err := inNode(n2, tendril, "-H", "unix://"+client.DefaultSocket, "encrypt", "status")
		t.Logf("node2's encrypt status after:\n%s", out)
		if err != nil {
			t.Fatalf("encrypt status: %v", err)
		}
		if !strings.Contains(out, n1.Address) {
			t.Errorf("node2's encrypt status has no peer at %s", n1.Address)
		}
	}
	// killAgent kills node2's agent process: its container exits and the
	// kubelet starts it again in the same pod, while the device runs on in
	// the pod's wireguard-device container (the same process, untouched).
	killAgent := func(t *testing.T) {
		agentPID, devicePID := agentProcesses(t, n2)
		before := agentPodOn(t, cs, n2.Name)
		restarts := agentRestarts(before)
		if err := syscall.Kill(agentPID, syscall.SIGKILL); err != nil {
			t.Fatalf("kill node2's agent (pid %d): %v", agentPID, err)
		}
		poll(t, "node2's agent container restarted and Ready", func() (bool, error) {
			p := agentPodOn(t, cs, n2.Name)
			return p.UID == before.UID && agentRestarts(p) > restarts && lab.PodReady(p), fmt.Errorf("restarts %d, ready %v", agentRestarts(p), lab.PodReady(p))
		})
		newAgent, newDevice := agentProcesses(t, n2)
		if newAgent == agentPID {
			t.Errorf("node2's agent process %d not replaced", agentPID)
		}
		if devicePID == 0 || syscall.Kill(devicePID, 0) != nil || newDevice != devicePID {
			t.Errorf("the device process %d did not outlive the agent's container (now %d)", devicePID, newDevice)
		} else {
			t.Logf("the device process %d outlived the agent's container", devicePID)
		}
	}

	// The agent's container killed: the device, its key and its peers
	// live on in their own container, as the pinned datapath does, so
	// nothing is lost. One ping may be in flight when ping is stopped.
	t.Run("the agent container restarted under traffic", func(t *testing.T) { underTraffic(t, 1, killAgent) })
	// The chart's strict mode, rolled out under traffic: each agent pod is
	// deleted and made again, one node at a time.
	// The pods replaced: their device containers too (the persistent
	// TUN links keep the pods' packets off the wire meanwhile).
	t.Run("helm upgrade to strict mode under traffic", func(t *testing.T) {
		underTraffic(t, -1, func(t *testing.T) {
			helm, err := exec.Command(filepath.Join(moduleRoot(t), "hack", "helm.sh")).Output()
			if err != nil {
				t.Fatalf("hack/helm.sh: %v", err)
			}
			out, err := exec.Command(strings.TrimSpace(string(helm)), "upgrade", "tendril", filepath.Join(moduleRoot(t), "deploy", "helm", "tendril"),
				"--namespace", lab.ChartNamespace, "--kubeconfig", st.Kubeconfig, "--reuse-values", "--set", "encryption.strictMode.enabled=true").CombinedOutput()
			if err != nil {
				t.Fatalf("helm upgrade: %v\n%s", err, out)
			}
			waitRolledOut(t, cs, "e2e")
		})
		cm, err := cs.CoreV1().ConfigMaps(lab.ChartNamespace).Get(ctx, "tendril-config", metav1.GetOptions{})
		if err != nil || cm.Data["wireguard-strict"] != "true" {
			t.Fatalf("the agents' wireguard-strict after the upgrade: %q (%v)", cm.Data["wireguard-strict"], err)
		}
	})
	t.Run("the agent container restarted under traffic, strict mode", func(t *testing.T) { underTraffic(t, 1, killAgent) })
}

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }

// datapathCounts is the node's datapath counters (`tendril bpf metrics
// list` in its mount namespace) by "reason (direction)".
func datapathCounts(t *testing.T, tendril string, inNode func(lab.Node, ...string) (string, error), n lab.Node) map[string]uint64 {
	t.Helper()
	out, err := inNode(n, tendril, "bpf", "metrics", "list", "-o", "json")
	if err != nil {
		t.Fatalf("%s: bpf metrics list: %v\n%s", n.Name, err, out)
	}
	var rows []struct {
		Reason, Direction string
		Packets           uint64
	}
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("%s: bpf metrics list: %v\n%s", n.Name, err, out)
	}
	m := map[string]uint64{}
	for _, r := range rows {
		m[r.Reason+" ("+r.Direction+")"] += r.Packets
	}
	return m
}

// agentRestarts is the restart count of p's agent container.
func agentRestarts(p *corev1.Pod) int32 {
	for _, c := range p.Status.ContainerStatuses {
		if c.Name == "agent" {
			return c.RestartCount
		}
	}
	return -1
}

// agentProcesses finds, in the node's network namespace, the agent's
// process (the container's command) and its WireGuard device process (the
// agent pod shares the host's PID namespace: the chart's hostPID with
// kubeProxyReplacement).
func agentProcesses(t *testing.T, n lab.Node) (agent, device int) {
	t.Helper()
	var want syscall.Stat_t
	if err := syscall.Stat(lab.NetnsPath(n.Netns), &want); err != nil {
		t.Fatal(err)
	}
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		var st syscall.Stat_t
		if syscall.Stat(filepath.Join(d, "ns", "net"), &st) != nil || st.Ino != want.Ino {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil {
			continue
		}
		argv := bytes.Split(bytes.TrimRight(cmdline, "\x00"), []byte{0})
		if len(argv) < 2 || filepath.Base(string(argv[0])) != "tendril-agent" {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(d))
		switch string(argv[1]) {
		case "--config-dir=/etc/tendril/config":
			agent = pid
		case "wireguard-device":
			device = pid
		}
	}
	if agent == 0 || device == 0 {
		t.Fatalf("node %s: agent process %d, device process %d", n.Name, agent, device)
	}
	return agent, device
}

// captureBridgePorts captures both nodes' ports on the lab's bridge until
// the returned function is called, which returns their frames.
func captureBridgePorts(t *testing.T, st *lab.State) func() [][]byte {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	self, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	h, err := netns.GetFromName(st.NetNetns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := netns.Set(h); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := netns.Set(self); err != nil {
			panic(err)
		}
	}()
	var caps []*rawcap.Capture
	for _, n := range st.Nodes {
		c, err := rawcap.Start(n.Name)
		if err != nil {
			t.Fatal(err)
		}
		caps = append(caps, c)
	}
	t.Cleanup(func() {
		for _, c := range caps {
			c.Stop()
		}
	})
	return func() [][]byte {
		var all [][]byte
		for _, c := range caps {
			all = append(all, c.Stop()...)
		}
		return all
	}
}
