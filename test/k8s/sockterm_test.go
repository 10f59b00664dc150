package k8s_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/k8s"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// The client and backends of TestPrivilegedServiceSocketsLeaveRemovedBackend
// run in a child process of the test binary, started into the agent's
// socket-LB cgroup and a network namespace of its own where the two
// backends' addresses are local (on its loopback): real sockets, translated by
// the agent's socket hooks, found by its sweep through the cgroup.
const socketsHelperEnv = "TENDRIL_K8S_SOCKETS_HELPER"

// socketsRequest is what the child does: servers on Backends (each answers
// with its address), a connected UDP socket to UDP and a TCP connection to
// TCP (two ClusterIP frontends).
type socketsRequest struct {
	Backends []string
	UDPPort  int
	TCPPort  int
	UDP, TCP string
}

type socketsReady struct {
	UDP, TCP, Err string
}

type socketsAfter struct {
	// UDPErrno is what the blocked receive on the connected UDP socket
	// returned, UDPAt when; UDPReconnect who answers once it connects to
	// the frontend again.
	UDPErrno     int
	UDPAt        time.Time
	UDPReconnect string
	// TCPErrno: the client's blocked read; ServerErr: the backend's side.
	TCPErrno  int
	TCPAt     time.Time
	ServerErr string
	Err       string
}

func socketsHelperMain() int {
	var req socketsRequest
	if err := json.Unmarshal([]byte(os.Getenv(socketsHelperEnv)), &req); err != nil {
		fmt.Fprintln(os.Stderr, "helper request:", err)
		return 2
	}
	if err := socketsHelper(req); err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 1
	}
	return 0
}

func errnoOf(err error) int {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return int(errno)
	}
	return -1
}

func socketsHelper(req socketsRequest) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return err
	}
	serverErr := make(chan string, 8)
	for _, b := range req.Backends {
		addr, err := netlink.ParseAddr(b + "/32")
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(lo, addr); err != nil {
			return fmt.Errorf("add %s: %w", b, err)
		}
		pc, err := net.ListenPacket("udp", net.JoinHostPort(b, fmt.Sprint(req.UDPPort)))
		if err != nil {
			return err
		}
		go func(name string) {
			buf := make([]byte, 64)
			for {
				_, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				_, _ = pc.WriteTo([]byte(name), from)
			}
		}(b)
		ln, err := net.Listen("tcp", net.JoinHostPort(b, fmt.Sprint(req.TCPPort)))
		if err != nil {
			return err
		}
		go func(name string) {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					buf := make([]byte, 64)
					for {
						if _, err := c.Read(buf); err != nil {
							serverErr <- err.Error()
							return
						}
						_, _ = c.Write([]byte(name))
					}
				}()
			}
		}(b)
	}
	out := json.NewEncoder(os.Stdout)
	udpDst := sockaddrOf(netip.MustParseAddrPort(req.UDP))
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	tv := unix.Timeval{Sec: 10}
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	buf := make([]byte, 64)
	udpPing := func() (string, error) {
		if _, err := unix.Write(fd, []byte("ping")); err != nil {
			return "", err
		}
		n, err := testutil.RetryEINTR(func() (int, error) { return unix.Read(fd, buf) })
		if err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	var r socketsReady
	err = unix.Connect(fd, udpDst)
	if err == nil {
		r.UDP, err = udpPing()
	}
	tcp, err2 := net.Dial("tcp", req.TCP)
	if err2 == nil {
		if _, err2 = tcp.Write([]byte("ping")); err2 == nil {
			var n int
			n, err2 = tcp.Read(buf)
			r.TCP = string(buf[:n])
		}
	}
	if err := errors.Join(err, err2); err != nil {
		r.Err = err.Error()
		return out.Encode(r)
	}
	if err := out.Encode(r); err != nil {
		return err
	}
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "go" {
		return fmt.Errorf("waiting for go: %q %v", line, err)
	}
	var a socketsAfter
	// Both sockets wait for an answer that only a destroyed socket gives.
	tcpDone := make(chan struct{})
	go func() {
		defer close(tcpDone)
		_ = tcp.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err := tcp.Read(make([]byte, 64))
		a.TCPErrno, a.TCPAt = errnoOf(err), time.Now()
	}()
	_, _, rerr := unix.Recvfrom(fd, buf, 0)
	a.UDPErrno, a.UDPAt = errnoOf(rerr), time.Now()
	if err := unix.Connect(fd, udpDst); err != nil {
		a.Err = fmt.Sprintf("reconnect: %v", err)
	} else if a.UDPReconnect, err = udpPing(); err != nil {
		a.Err = fmt.Sprintf("after reconnect: %v", err)
	}
	<-tcpDone
	select {
	case a.ServerErr = <-serverErr:
	case <-time.After(5 * time.Second):
		a.ServerErr = "the backend's connection did not end"
	}
	return out.Encode(a)
}

func sockaddrOf(ap netip.AddrPort) unix.Sockaddr {
	return &unix.SockaddrInet4{Addr: ap.Addr().As4(), Port: int(ap.Port())}
}

// TestPrivilegedServiceSocketsLeaveRemovedBackend: with socket LB, a
// connected UDP socket (the stale DNS server case) and a TCP connection
// sent through two ClusterIPs to backend .11 are destroyed by the agent
// once the EndpointSlices replace .11 by .12: the UDP socket's blocked
// receive returns ECONNABORTED and, connected again to the same ClusterIP,
// it reaches .12; the TCP client gets ECONNABORTED and the backend a
// reset. The time from the EndpointSlice update to each error is logged.
// The stock cilium-dbg lists both services from the agent's API.
func TestPrivilegedServiceSocketsLeaveRemovedBackend(t *testing.T) {
	testutil.Privileged(t)
	testutil.Require(t, startErr == nil, fmt.Sprintf("no control plane: %v", startErr))
	clients, err := k8s.NewClientsForConfig(env.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	cs := clients.Core
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const nodeName, ns = "node-sockterm", "sockterm"
	if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName},
		Spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.31.0/24"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	mkSvc := func(name string, port int32, proto corev1.Protocol) *corev1.Service {
		s, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: name, Port: port, Protocol: proto}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	resolver, web := mkSvc("resolver", 53, corev1.ProtocolUDP), mkSvc("web", 80, corev1.ProtocolTCP)
	at := func(ip string) discoveryv1.Endpoint {
		e := endpoint(ip, true, true, false)
		e.NodeName = nil
		return e
	}
	slices := cs.DiscoveryV1().EndpointSlices(ns)
	resolverSlice, err := slices.Create(ctx, slice(ns, "resolver-1", "resolver", 5353, corev1.ProtocolUDP, "resolver", at("10.244.31.11")), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	webSlice, err := slices.Create(ctx, slice(ns, "web-1", "web", 8080, corev1.ProtocolTCP, "web", at("10.244.31.11")), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	root := "/sys/fs/bpf/tendril-k8s-sockterm-" + randHex()
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	cg := "/sys/fs/cgroup/unified/tendril-test-sockterm-" + randHex()
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(cg) })
	a := startAgent(t, nodeName, "--enable-datapath=true", "--bpf-root", root, "--ipv4-range", "10.244.31.0/24", "--ipv6-range", "none", "--cgroup-root", cg)
	a.waitServing(t)
	udpFE := maps.Frontend{Addr: netip.MustParseAddr(resolver.Spec.ClusterIP), Port: 53, Proto: maps.ProtoUDP}
	tcpFE := maps.Frontend{Addr: netip.MustParseAddr(web.Spec.ClusterIP), Port: 80, Proto: maps.ProtoTCP}
	for _, fe := range []maps.Frontend{udpFE, tcpFE} {
		eventually(t, fmt.Sprintf("%s in the LB maps", fe.Addr), func() (bool, error) {
			st := readFrontend(t, root, fe)
			return len(st.backends) == 1, fmt.Errorf("maps hold %+v", st)
		})
	}

	t.Run("cilium-dbg service list", func(t *testing.T) {
		out, err := exec.Command("../../hack/cilium-dbg.sh").Output()
		testutil.Require(t, err == nil, fmt.Sprintf("stock cilium-dbg not built: %v", err))
		bin := strings.TrimSpace(string(out))
		list, err := exec.Command(bin, "-H", "unix://"+a.api.Socket(), "service", "list").CombinedOutput()
		if err != nil {
			t.Fatalf("cilium-dbg service list: %v\n%s", err, list)
		}
		t.Logf("cilium-dbg service list:\n%s", list)
		for _, want := range []string{resolver.Spec.ClusterIP + ":53/UDP", web.Spec.ClusterIP + ":80/TCP", "10.244.31.11:5353/UDP", "10.244.31.11:8080/TCP"} {
			if !strings.Contains(string(list), want) {
				t.Errorf("cilium-dbg service list lacks %q", want)
			}
		}
	})

	cgf, err := os.Open(cg)
	if err != nil {
		t.Fatal(err)
	}
	defer cgf.Close()
	req, _ := json.Marshal(socketsRequest{Backends: []string{"10.244.31.11", "10.244.31.12"}, UDPPort: 5353, TCPPort: 8080,
		UDP: netip.AddrPortFrom(udpFE.Addr, 53).String(), TCP: netip.AddrPortFrom(tcpFE.Addr, 80).String()})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), socketsHelperEnv+"="+string(req))
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, UseCgroupFD: true, CgroupFD: int(cgf.Fd())}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	timer := time.AfterFunc(90*time.Second, func() { _ = cmd.Process.Kill() })
	defer func() {
		stdin.Close()
		_ = cmd.Wait()
		timer.Stop()
	}()
	dec := json.NewDecoder(stdout)
	var r socketsReady
	if err := dec.Decode(&r); err != nil {
		t.Fatalf("child's ready report: %v; stderr: %s", err, stderr.String())
	}
	if r.Err != "" || r.UDP != "10.244.31.11" || r.TCP != "10.244.31.11" {
		t.Fatalf("before the change both sockets should reach .11: %+v", r)
	}

	// The child blocks on both sockets; then .11 goes and .12 comes: the
	// sweep follows the reconciler's write.
	if _, err := stdin.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // let the child block: only the reported times depend on it
	changed := time.Now()
	resolverSlice.Endpoints = []discoveryv1.Endpoint{at("10.244.31.12")}
	webSlice.Endpoints = []discoveryv1.Endpoint{at("10.244.31.12")}
	if _, err := slices.Update(ctx, resolverSlice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := slices.Update(ctx, webSlice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var af socketsAfter
	if err := dec.Decode(&af); err != nil {
		t.Fatalf("child's report: %v; stderr: %s", err, stderr.String())
	}
	t.Logf("after the EndpointSlice updates: UDP errno %d %v later, TCP errno %d %v later, reconnected to %s, backend saw %q",
		af.UDPErrno, af.UDPAt.Sub(changed), af.TCPErrno, af.TCPAt.Sub(changed), af.UDPReconnect, af.ServerErr)
	if af.Err != "" {
		t.Fatal(af.Err)
	}
	if af.UDPErrno != int(unix.ECONNABORTED) {
		t.Errorf("connected UDP socket: errno %d, want ECONNABORTED", af.UDPErrno)
	}
	if af.UDPReconnect != "10.244.31.12" {
		t.Errorf("reconnected UDP socket reached %q, want 10.244.31.12", af.UDPReconnect)
	}
	if af.TCPErrno != int(unix.ECONNABORTED) {
		t.Errorf("TCP client: errno %d, want ECONNABORTED", af.TCPErrno)
	}
	if !strings.Contains(af.ServerErr, "connection reset") {
		t.Errorf("backend's side of the TCP connection: %q, want a reset", af.ServerErr)
	}
	// The totals are counted once a sweep has been through every
	// namespace, which may end after the child saw its sockets go.
	eventually(t, "the status to count both sockets", func() (bool, error) {
		v := section(a.status(t), "Services", "sockets of removed backends")
		return strings.HasPrefix(v, "2 destroyed (0 refused)"), fmt.Errorf("status line %q", v)
	})
}
