package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/lab"
	"github.com/tendril-net/tendril/pkg/lab/workload"
)

// udpStreamEnv makes the test binary a UDP client instead of a test run
// (see TestMain): `tendril lab exec` starts it inside a pod (its network
// namespace and its node's cgroup, where the socket load-balancer
// translates), which a goroutine of the test process cannot be.
const udpStreamEnv = "TDR_E2E_UDP_STREAM"

// udpStreamResult is what the UDP client prints.
type udpStreamResult struct {
	Sent, Answered int
	// Gaps are the runs of consecutive unanswered requests (their lengths).
	Gaps []int
	Pods map[string]int
}

// runUDPStream sends count requests to addr, one every interval, each on a
// new connected socket (so each is translated at connect by whatever the
// node's maps hold then), waits up to 500 ms for each answer, and prints
// the result as JSON. SIGINT ends it early (after the request under
// way), with the result so far: a test that cannot know how long its
// disturbance lasts runs it until then.
func runUDPStream(spec string) int {
	f := strings.Fields(spec)
	if len(f) != 3 {
		fmt.Fprintln(os.Stderr, "want ADDR COUNT INTERVAL in", udpStreamEnv, "got", spec)
		return 2
	}
	addr := f[0]
	count, err1 := strconv.Atoi(f[1])
	interval, err2 := time.ParseDuration(f[2])
	if err1 != nil || err2 != nil {
		fmt.Fprintln(os.Stderr, "bad", udpStreamEnv, spec, err1, err2)
		return 2
	}
	interrupted := make(chan os.Signal, 1)
	signal.Notify(interrupted, os.Interrupt)
	res := udpStreamResult{Pods: map[string]int{}}
	gap := 0
	next := time.Now()
	buf := make([]byte, 256)
requests:
	for i := 0; i < count; i++ {
		select {
		case <-interrupted:
			break requests
		case <-time.After(time.Until(next)):
		}
		next = next.Add(interval)
		res.Sent++
		answered := func() bool {
			c, err := net.Dial("udp", addr)
			if err != nil {
				return false
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
			if _, err := c.Write([]byte(workload.ProbeRequest)); err != nil {
				return false
			}
			n, err := c.Read(buf)
			if err != nil {
				return false
			}
			res.Pods[string(bytes.TrimSpace(buf[:n]))]++
			return true
		}()
		if answered {
			res.Answered++
			if gap > 0 {
				res.Gaps = append(res.Gaps, gap)
				gap = 0
			}
		} else {
			gap++
		}
	}
	if gap > 0 {
		res.Gaps = append(res.Gaps, gap)
	}
	_ = json.NewEncoder(os.Stdout).Encode(res)
	return 0
}

// killAgent kills a node's agent with SIGKILL and returns its command
// line.
func killAgent(t *testing.T, st *lab.State, node string) []string {
	t.Helper()
	return signalAgent(t, st, node, syscall.SIGKILL, "die")
}

// lbIDs are a frontend's IDs in a node's pinned maps.
type lbIDs struct {
	Service, RevNAT uint32
	Backends        []uint32
}

func readLBIDs(t *testing.T, bpfRoot string, fe maps.Frontend) lbIDs {
	t.Helper()
	m, err := maps.OpenPinnedLB(bpfRoot, true)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	s, ok, err := m.ServiceMap().Lookup(fe)
	if err != nil || !ok {
		t.Fatalf("frontend %s not in the maps under %s (%v)", fe, bpfRoot, err)
	}
	slots, err := m.SlotMap().Get(s.ID, int(s.Count))
	if err != nil {
		t.Fatal(err)
	}
	return lbIDs{Service: s.ID, RevNAT: s.RevNATID, Backends: slots}
}

// TestPrivilegedLabServiceRestartUnderTraffic: a pod streams through
// ClusterIPs to a backend pod on the other node — an iperf3 TCP stream and
// 100 UDP requests a second, each on a new socket — while its node's agent
// is killed with SIGKILL, stays down a second and starts again. The
// pinned socket hooks and maps keep translating while no agent runs and
// across the restart: iperf3 runs its whole time without an error, no
// UDP request goes unanswered, and the service, reverse NAT and backend
// IDs in the node's maps are the same before and after.
func TestPrivilegedLabServiceRestartUnderTraffic(t *testing.T) {
	e := labUp(t)
	client, err := e.st.Pod("default", "pod-1")
	if err != nil {
		t.Fatal(err)
	}
	var other string
	for _, n := range e.st.Nodes {
		if n.Name != client.Node {
			other = n.Name
		}
	}
	ctx := context.Background()
	const backend = "svcrestart-backend"
	e.createPod(t, "default", backend, other, map[string]string{"svcrestart": "backend"},
		corev1.ContainerPort{ContainerPort: 80, Protocol: corev1.ProtocolUDP})
	t.Cleanup(func() {
		zero := int64(0)
		_ = e.cs.CoreV1().Pods("default").Delete(context.Background(), backend, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	})
	e.waitReady(t, "default", backend)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "svcrestart", Namespace: "default"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"svcrestart": "backend"}, Ports: []corev1.ServicePort{
			{Name: "udp", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(80)},
			{Name: "iperf", Protocol: corev1.ProtocolTCP, Port: 5201, TargetPort: intstr.FromInt32(5201)},
		}},
	}
	created, err := e.cs.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.cs.CoreV1().Services("default").Delete(context.Background(), svc.Name, metav1.DeleteOptions{})
	})
	eventually(t, "the Service's endpoint", func() (bool, error) {
		sl, err := e.cs.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc.Name})
		if err != nil {
			return false, err
		}
		n := 0
		for _, s := range sl.Items {
			n += len(s.Endpoints)
		}
		return n == 1, fmt.Errorf("%d endpoints", n)
	})
	ip := netip.MustParseAddr(created.Spec.ClusterIP)
	udpFE := netip.AddrPortFrom(ip, 53)
	tcpFE := netip.AddrPortFrom(ip, 5201)
	eventually(t, "an answer at the ClusterIP", func() (bool, error) {
		code, out := tendril(t, "probe", "default/pod-1", udpFE.String(), "--udp", "--timeout", "1s")
		return code == 0 && strings.Contains(out, backend), fmt.Errorf("exit %d: %s", code, out)
	})

	node, err := e.st.Node(client.Node)
	if err != nil {
		t.Fatal(err)
	}
	before := map[string]lbIDs{}
	for name, fe := range map[string]maps.Frontend{
		"udp": {Addr: ip, Port: 53, Proto: maps.ProtoUDP}, "tcp": {Addr: ip, Port: 5201, Proto: maps.ProtoTCP},
	} {
		before[name] = readLBIDs(t, node.BPFRoot, fe)
	}

	// The iperf3 server in the backend pod, the client in pod-1 (its
	// node's cgroup: the socket hooks translate its connect).
	server := exec.Command(tendrilBin, "lab", "--name", labName, "exec", "default/"+backend, "--", "iperf3", "-s", "-1", "-p", "5201")
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = server.Process.Kill(); _ = server.Wait() })
	eventually(t, "iperf3 listening in the backend pod", func() (bool, error) {
		code, out := tendril(t, "exec", "default/"+backend, "--", "ss", "-Hltn", "sport = :5201")
		return code == 0 && strings.Contains(out, "5201"), fmt.Errorf("exit %d: %s", code, out)
	})
	const seconds = 10
	var iperfOut bytes.Buffer
	iperf := exec.Command(tendrilBin, "lab", "--name", labName, "exec", "default/pod-1", "--",
		"iperf3", "-c", tcpFE.Addr().String(), "-p", "5201", "-t", strconv.Itoa(seconds), "-b", "100M", "-J")
	iperf.Stdout, iperf.Stderr = &iperfOut, &iperfOut
	if err := iperf.Start(); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	const requests = 900 // 9 s at 100/s
	var udpOut, udpErr bytes.Buffer
	udp := exec.Command(tendrilBin, "lab", "--name", labName, "exec", "default/pod-1", "--", self)
	udp.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d 10ms", udpStreamEnv, udpFE, requests))
	udp.Stdout, udp.Stderr = &udpOut, &udpErr
	if err := udp.Start(); err != nil {
		t.Fatal(err)
	}

	// Two seconds into the streams, kill -9 the client node's agent; a
	// second later start it again.
	time.Sleep(2 * time.Second)
	argv := killAgent(t, e.st, client.Node)
	killed := time.Now()
	time.Sleep(time.Second)
	startAgent(t, e.st, client.Node, argv)
	waitAgentAPI(t, *node)
	t.Logf("agent of %s killed and back in %s", client.Node, time.Since(killed).Round(time.Millisecond))

	iperfErr := iperf.Wait()
	if err := udp.Wait(); err != nil {
		t.Fatalf("UDP client: %v\n%s%s", err, udpOut.String(), udpErr.String())
	}
	var res udpStreamResult
	if err := json.Unmarshal(udpOut.Bytes(), &res); err != nil {
		t.Fatalf("UDP client output: %v\n%s%s", err, udpOut.String(), udpErr.String())
	}
	t.Logf("UDP through %s across the restart: %d sent, %d answered, gaps %v, answered by %v", udpFE, res.Sent, res.Answered, res.Gaps, res.Pods)
	if res.Sent != requests || res.Answered != requests || res.Pods[backend] != requests {
		t.Errorf("UDP requests lost across the agent's restart: %d of %d answered (by %v)", res.Answered, res.Sent, res.Pods)
	}
	var ir struct {
		End struct {
			SumSent struct {
				Seconds     float64 `json:"seconds"`
				Bytes       int64   `json:"bytes"`
				Retransmits int     `json:"retransmits"`
			} `json:"sum_sent"`
		} `json:"end"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal(iperfOut.Bytes(), &ir); err != nil || iperfErr != nil || ir.Error != "" {
		t.Fatalf("iperf3 through %s: %v / %v / %q\n%s", tcpFE, iperfErr, err, ir.Error, iperfOut.String())
	}
	t.Logf("iperf3 through %s across the restart: %.1f s, %d MB, %d retransmits", tcpFE, ir.End.SumSent.Seconds,
		ir.End.SumSent.Bytes>>20, ir.End.SumSent.Retransmits)
	if ir.End.SumSent.Seconds < seconds-0.5 || ir.End.SumSent.Bytes == 0 {
		t.Errorf("iperf3 stream broken: ran %.1f s of %d", ir.End.SumSent.Seconds, seconds)
	}

	// The restarted agent realizes the frontends again once its sources
	// synced, under the IDs it restored from the maps.
	eventually(t, "the restarted agent to realize the frontends", func() (bool, error) {
		out, err := runCLI(tendrilBin, "-H", node.Socket, "service", "list")
		if err != nil {
			return false, err
		}
		realized := 0
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) < 5 || f[len(f)-1] != "true" {
				continue
			}
			for name, fe := range map[string]netip.AddrPort{"udp": udpFE, "tcp": tcpFE} {
				if strings.HasPrefix(f[1], fe.String()+"/") {
					if f[0] != strconv.Itoa(int(before[name].Service)) {
						return false, fmt.Errorf("%s frontend realized with service ID %s, was %d", name, f[0], before[name].Service)
					}
					realized++
				}
			}
		}
		return realized == 2, fmt.Errorf("%d of 2 frontends realized:\n%s", realized, out)
	})
	for name, fe := range map[string]maps.Frontend{
		"udp": {Addr: ip, Port: 53, Proto: maps.ProtoUDP}, "tcp": {Addr: ip, Port: 5201, Proto: maps.ProtoTCP},
	} {
		after := readLBIDs(t, node.BPFRoot, fe)
		if fmt.Sprint(after) != fmt.Sprint(before[name]) {
			t.Errorf("%s frontend's IDs changed across the restart: %+v, were %+v", name, after, before[name])
		}
	}
	if code := probe(t, "default/pod-1", udpFE.String(), true); code != 0 {
		t.Errorf("ClusterIP after the restart: probe exit %d", code)
	}
}
