package cni_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/cilium/api/v1/models"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// Services under change and restart, with real pods and real traffic
// through the pod programs' per-packet NAT (socket LB off: the node's
// processes are not in a socket-LB cgroup): a UDP request stream through a
// ClusterIP while its backends scale up and down, and a kill -9 of the
// agent under a 100/s ping, that UDP stream and an iperf3 TCP stream
// through a ClusterIP.

// udpEchoIn answers every datagram on addr inside the pod with the pod's
// name.
func udpEchoIn(t *testing.T, p *pod, addr string) {
	t.Helper()
	var pc net.PacketConn
	var err error
	if nerr := inNetnsDo(p.netns, func() { pc, err = net.ListenPacket("udp", addr) }); nerr != nil {
		t.Fatal(nerr)
	}
	if err != nil {
		t.Fatalf("listen on %s in %s: %v", addr, p.name, err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 64)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo([]byte(p.name+" "+string(buf[:n])), from)
		}
	}()
}

// udpStream sends one request every interval through dst from the pod,
// each on a new socket (a new flow, so every request is load-balanced
// anew), and records who answered each; a request without an answer
// within a second is lost.
type udpStream struct {
	mu       sync.Mutex
	sent     int
	lost     []int
	byServer map[string]int
	stop     chan struct{}
	done     chan struct{}
}

func startUDPStream(t *testing.T, from *pod, dst string, interval time.Duration) *udpStream {
	t.Helper()
	s := &udpStream{byServer: map[string]int{}, stop: make(chan struct{}), done: make(chan struct{})}
	// Sockets are made in the pod's namespace and used from any thread.
	dial := func() (net.Conn, error) {
		var c net.Conn
		var err error
		if nerr := inNetnsDo(from.netns, func() { c, err = net.Dial("udp", dst) }); nerr != nil {
			return nil, nerr
		}
		return c, err
	}
	var wg sync.WaitGroup
	go func() {
		defer close(s.done)
		defer wg.Wait()
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for seq := 0; ; seq++ {
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
			s.mu.Lock()
			s.sent++
			s.mu.Unlock()
			wg.Add(1)
			go func(seq int) {
				defer wg.Done()
				answer, err := func() (string, error) {
					c, err := dial()
					if err != nil {
						return "", err
					}
					defer c.Close()
					if _, err := fmt.Fprintf(c, "%d", seq); err != nil {
						return "", err
					}
					_ = c.SetReadDeadline(time.Now().Add(time.Second))
					buf := make([]byte, 64)
					n, err := c.Read(buf)
					if err != nil {
						return "", err
					}
					return string(buf[:n]), nil
				}()
				s.mu.Lock()
				defer s.mu.Unlock()
				server, gotSeq, _ := strings.Cut(answer, " ")
				if err != nil || gotSeq != fmt.Sprint(seq) {
					s.lost = append(s.lost, seq)
					return
				}
				s.byServer[server]++
			}(seq)
		}
	}()
	return s
}

// snapshot returns the counts so far.
func (s *udpStream) snapshot() (sent int, lost []int, byServer map[string]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	byServer = map[string]int{}
	for k, v := range s.byServer {
		byServer[k] = v
	}
	return s.sent, append([]int(nil), s.lost...), byServer
}

func (s *udpStream) finish() (sent int, lost []int, byServer map[string]int) {
	close(s.stop)
	<-s.done
	return s.snapshot()
}

// serviceNode is a node whose agent watches a real API server (forwarded
// into the node's namespace) and a client for it.
func serviceNode(t *testing.T, ctx context.Context, podCIDR string) (*node, kubernetes.Interface, []string) {
	t.Helper()
	env, err := startControlPlane(t, ctx)
	testutil.Require(t, err == nil, fmt.Sprintf("no control plane: %v", err))
	cs := env.Clientset()
	apiAddr := strings.TrimPrefix(env.RESTConfig().Host, "https://")
	n := newNode(t)
	forwardAPIServer(t, n.netns, apiAddr)
	eventually(t, "the Node created", func() bool {
		_, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name},
			Spec: corev1.NodeSpec{PodCIDRs: []string{podCIDR}}}, metav1.CreateOptions{})
		return err == nil
	})
	args := []string{"--kubeconfig", env.Kubeconfig(), "--ipv6-range", "none"}
	n.start(t, args...)
	return n, cs, args
}

func readyEndpoint(ip, node string) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{ip}, NodeName: ptr.To(node), Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}
}

// waitRealized waits until the agent reports the frontend realized with
// exactly the backends want (addresses).
func waitRealized(t *testing.T, n *node, ctx context.Context, clusterIP string, port uint16, want ...string) {
	t.Helper()
	wantSet := fmt.Sprint(want)
	eventually(t, fmt.Sprintf("%s:%d realized with %v", clusterIP, port, want), func() bool {
		var out []*models.Service
		if err := n.agent.Do(ctx, http.MethodGet, "/service", nil, nil, nil, &out); err != nil {
			return false
		}
		for _, s := range out {
			if s.Spec.FrontendAddress.IP != clusterIP || s.Spec.FrontendAddress.Port != port || s.Status.Realized == nil {
				continue
			}
			var got []string
			for _, b := range s.Status.Realized.BackendAddresses {
				got = append(got, *b.IP)
			}
			return fmt.Sprint(got) == wantSet
		}
		return false
	})
}

// lbIDs reads a frontend's IDs from the node's pinned LB maps: service,
// reverse NAT and its slots' backend IDs.
func lbIDs(t *testing.T, n *node, fe maps.Frontend) string {
	t.Helper()
	m, err := maps.OpenPinnedLB(n.bpfRoot, true)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	s, ok, err := m.ServiceMap().Lookup(fe)
	if err != nil || !ok {
		t.Fatalf("frontend %v not in the maps (%v)", fe, err)
	}
	slots, err := m.SlotMap().Get(s.ID, int(s.Count))
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("service %d, reverse NAT %d, backends %v", s.ID, s.RevNATID, slots)
}

// TestPrivilegedServiceScaleAndRestartUnderTraffic: a backend pod reaches
// itself through a ClusterIP (hairpin, per packet). A client pod sends 100
// UDP requests a second through a ClusterIP (a new flow each) while the
// service's backends scale up (a third backend starts answering) and down
// (the first leaves the slice, still running): no request is lost. Then
// the agent is killed with SIGKILL and started again while that stream, a
// 100/s ping from the client to a backend (ICMP is not a service protocol:
// neither the socket hooks nor the per-packet NAT translate it, so the
// ping checks the pod path itself) and an iperf3 TCP stream through a
// second ClusterIP run: nothing is lost, iperf3 ends normally, and the
// service, reverse NAT and backend IDs are the same after the restart.
func TestPrivilegedServiceScaleAndRestartUnderTraffic(t *testing.T) {
	testutil.Privileged(t)
	iperf, err := exec.LookPath("iperf3")
	testutil.Require(t, err == nil, "iperf3 missing (hack/install-deps.sh installs it)")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	n, cs, agentArgs := serviceNode(t, ctx, "10.244.41.0/24")
	list := n.confList("tendril-cni", "1.1.0", nil)
	client := n.newPod("client")
	n.mustAdd(list, client)
	backends := map[string]*pod{}
	ips := map[string]string{}
	for _, name := range []string{"b1", "b2", "b3"} {
		p := n.newPod(name)
		ips[name] = ipv4Of(t, n.mustAdd(list, p))
		backends[name] = p
		udpEchoIn(t, p, "0.0.0.0:5353")
	}

	mkService := func(name string, port, target int32, proto corev1.Protocol) *corev1.Service {
		t.Helper()
		s, err := cs.CoreV1().Services("default").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: name, Port: port, TargetPort: intstr.FromInt32(target), Protocol: proto}}}},
			metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	dns := mkService("dns", 53, 5353, corev1.ProtocolUDP)
	bulk := mkService("bulk", 80, 5201, corev1.ProtocolTCP)
	slices := cs.DiscoveryV1().EndpointSlices("default")
	setSlice := func(name string, port int32, proto corev1.Protocol, names ...string) {
		t.Helper()
		es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: name + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(name), Port: ptr.To(port), Protocol: ptr.To(proto)}}}
		for _, b := range names {
			es.Endpoints = append(es.Endpoints, readyEndpoint(ips[b], n.name))
		}
		cur, err := slices.Get(ctx, es.Name, metav1.GetOptions{})
		if err == nil {
			es.ResourceVersion = cur.ResourceVersion
			_, err = slices.Update(ctx, es, metav1.UpdateOptions{})
		} else {
			_, err = slices.Create(ctx, es, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	setSlice("dns", 5353, corev1.ProtocolUDP, "b1", "b2")
	setSlice("bulk", 5201, corev1.ProtocolTCP, "b1")
	waitRealized(t, n, ctx, dns.Spec.ClusterIP, 53, ips["b1"], ips["b2"])
	waitRealized(t, n, ctx, bulk.Spec.ClusterIP, 80, ips["b1"])
	dnsAddr := net.JoinHostPort(dns.Spec.ClusterIP, "53")

	t.Run("hairpin", func(t *testing.T) {
		// b1 reaches itself through a ClusterIP whose only backend it is.
		self := mkService("self", 80, 8081, corev1.ProtocolTCP)
		setSlice("self", 8081, corev1.ProtocolTCP, "b1")
		waitRealized(t, n, ctx, self.Spec.ClusterIP, 80, ips["b1"])
		ln := listenIn(t, backends["b1"].netns, "0.0.0.0:8081")
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				fmt.Fprintf(c, "b1 saw %s\n", c.RemoteAddr())
				c.Close()
			}
		}()
		frontend := net.JoinHostPort(self.Spec.ClusterIP, "80")
		for i := range 3 {
			c, err := dialFrom(backends["b1"].netns, frontend)
			if err != nil {
				t.Fatalf("hairpin connection %d to %s: %v", i, frontend, err)
			}
			b, err := io.ReadAll(c)
			peer := c.RemoteAddr().String()
			c.Close()
			if err != nil || !strings.HasPrefix(string(b), "b1 saw 169.254.42.1:") || peer != frontend {
				t.Fatalf("hairpin connection %d: %q (%v), peer %s; want b1 answering the hairpin address, the peer the frontend", i, b, err, peer)
			}
		}
	})

	t.Run("scale up and down", func(t *testing.T) {
		stream := startUDPStream(t, client, dnsAddr, 10*time.Millisecond)
		time.Sleep(500 * time.Millisecond)
		setSlice("dns", 5353, corev1.ProtocolUDP, "b1", "b2", "b3")
		waitRealized(t, n, ctx, dns.Spec.ClusterIP, 53, ips["b1"], ips["b2"], ips["b3"])
		eventually(t, "b3 answering", func() bool { _, _, by := stream.snapshot(); return by["b3"] > 0 })
		setSlice("dns", 5353, corev1.ProtocolUDP, "b2", "b3")
		waitRealized(t, n, ctx, dns.Spec.ClusterIP, 53, ips["b2"], ips["b3"])
		// Requests sent once b1 is out of the slots must not reach it.
		_, _, atRemoval := stream.snapshot()
		time.Sleep(time.Second)
		sent, lost, by := stream.finish()
		t.Logf("scale up and down: %d requests, %d lost, answered by %v", sent, len(lost), by)
		if len(lost) != 0 {
			t.Errorf("%d of %d requests lost (sequence numbers %v)", len(lost), sent, lost)
		}
		// A request in flight at the removal may still have been answered
		// by b1 (its flow keeps its backend): allow those, not more.
		if by["b1"] > atRemoval["b1"]+5 {
			t.Errorf("b1 answered %d requests after it left the slots (had %d)", by["b1"]-atRemoval["b1"], atRemoval["b1"])
		}
	})

	t.Run("kill -9 of the agent under traffic", func(t *testing.T) {
		setSlice("dns", 5353, corev1.ProtocolUDP, "b1", "b2")
		waitRealized(t, n, ctx, dns.Spec.ClusterIP, 53, ips["b1"], ips["b2"])
		dnsFE := maps.Frontend{Addr: netip.MustParseAddr(dns.Spec.ClusterIP), Port: 53, Proto: maps.ProtoUDP}
		bulkFE := maps.Frontend{Addr: netip.MustParseAddr(bulk.Spec.ClusterIP), Port: 80, Proto: maps.ProtoTCP}
		idsBefore := lbIDs(t, n, dnsFE) + "; " + lbIDs(t, n, bulkFE)

		server := exec.Command("nsenter", "--net="+backends["b1"].netns, iperf, "-s", "-p", "5201", "-1")
		if err := server.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = server.Process.Kill(); _ = server.Wait() })
		time.Sleep(300 * time.Millisecond) // the server listening: only its first connection's start depends on it
		type result struct {
			out []byte
			err error
		}
		iperfDone, pingDone := make(chan result, 1), make(chan result, 1)
		go func() {
			// A bounded rate: the machine's two cores are shared.
			out, err := exec.Command("nsenter", "--net="+client.netns, iperf, "-c", bulk.Spec.ClusterIP, "-p", "80", "-t", "8", "-b", "200M", "-J").CombinedOutput()
			iperfDone <- result{out, err}
		}()
		go func() {
			out, err := exec.Command("nsenter", "--net="+client.netns, "ping", "-i", "0.01", "-c", "800", "-W", "1", ips["b2"]).CombinedOutput()
			pingDone <- result{out, err}
		}()
		stream := startUDPStream(t, client, dnsAddr, 10*time.Millisecond)

		time.Sleep(2 * time.Second)
		n.killAgent(t)
		time.Sleep(time.Second) // traffic with no agent at all
		n.runAgent(t, agentArgs...)
		waitRealized(t, n, ctx, dns.Spec.ClusterIP, 53, ips["b1"], ips["b2"])
		waitRealized(t, n, ctx, bulk.Spec.ClusterIP, 80, ips["b1"])

		ir, pr := <-iperfDone, <-pingDone
		sent, lost, by := stream.finish()
		idsAfter := lbIDs(t, n, dnsFE) + "; " + lbIDs(t, n, bulkFE)

		var rep struct {
			End struct {
				SumSent struct {
					Bytes       int64   `json:"bytes"`
					Seconds     float64 `json:"seconds"`
					Retransmits int     `json:"retransmits"`
				} `json:"sum_sent"`
				SumReceived struct {
					Bytes int64 `json:"bytes"`
				} `json:"sum_received"`
			} `json:"end"`
			Error string `json:"error"`
		}
		jerr := json.Unmarshal(ir.out, &rep)
		if ir.err != nil || jerr != nil || rep.Error != "" {
			t.Errorf("iperf3 through %s:80 broke: %v %v %s\n%s", bulk.Spec.ClusterIP, ir.err, jerr, rep.Error, ir.out)
		} else if rep.End.SumReceived.Bytes == 0 || rep.End.SumSent.Seconds < 7.5 {
			t.Errorf("iperf3 stream cut short: %+v", rep.End)
		}
		m := regexp.MustCompile(`(\d+) packets transmitted, (\d+) received`).FindStringSubmatch(string(pr.out))
		if pr.err != nil || m == nil || m[1] != m[2] {
			t.Errorf("ping to b2 lost packets: %v\n%s", pr.err, lastLines(pr.out, 3))
		}
		t.Logf("restart under traffic: ping %s; UDP %d requests, %d lost, answered by %v; iperf3 %d bytes in %.1fs, %d retransmits",
			strings.TrimSpace(lastLines(pr.out, 2)), sent, len(lost), by, rep.End.SumReceived.Bytes, rep.End.SumSent.Seconds, rep.End.SumSent.Retransmits)
		if len(lost) != 0 {
			t.Errorf("%d of %d UDP requests through the ClusterIP lost (sequence numbers %v)", len(lost), sent, lost)
		}
		if idsAfter != idsBefore {
			t.Errorf("IDs changed across the restart:\nbefore %s\nafter  %s", idsBefore, idsAfter)
		}
		t.Logf("IDs across the restart: %s", idsAfter)
	})
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
