package loader

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/testutil"
	"github.com/tendril-net/tendril/pkg/testutil/netlab"
)

// podLab is a node namespace with pods (pkg/testutil/netlab) whose
// cleanup belongs to a test. The test's goroutine stays locked in the node
// namespace: TCX attach and BPF_PROG_TEST_RUN resolve interface indexes in
// the caller's namespace.
type podLab struct {
	t    *testing.T
	node *netlab.Node
	root string
}

// labPod is one pod of a podLab.
type labPod struct{ *netlab.Pod }

func newPodLab(t *testing.T) *podLab {
	testutil.Privileged(t)
	node, root := netlab.EnterNode(t, "tdrlab", "labtest")
	return &podLab{t: t, node: node, root: root}
}

// addPod creates pod number i (10.77.0.10+i, fd00:77::10+i).
func (lab *podLab) addPod(name string, i int) *labPod {
	lab.t.Helper()
	p, err := lab.node.AddPod(name, i)
	if err != nil {
		lab.t.Fatal(err)
	}
	return &labPod{p}
}

// loader starts a datapath on the lab's BPF root (TCX, direct delivery).
func (lab *podLab) loader() *Loader {
	lab.t.Helper()
	return lab.start(Config{DirectDelivery: true})
}

// start starts a datapath with cfg on the lab's BPF root.
func (lab *podLab) start(cfg Config) *Loader {
	lab.t.Helper()
	cfg.BPFRoot = lab.root
	l := New(cfg, slog.New(slog.NewTextHandler(testLogWriter{lab.t}, &slog.HandlerOptions{Level: slog.LevelWarn})))
	lab.t.Cleanup(func() { _ = l.Close() })
	if err := l.Start(); err != nil {
		lab.t.Fatal(err)
	}
	return l
}

// testLogWriter puts the loader's warnings into the test's log.
type testLogWriter struct{ t testing.TB }

func (w testLogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// endpoint is the pod as the agent describes it to the loader.
func (p *labPod) endpoint(id uint16, identity uint32, enforceIngress bool) EndpointInfo {
	return EndpointInfo{ID: id, IfIndex: p.HostIfIndex, IfName: p.HostIf, Addresses: []netip.Addr{p.IPv4, p.IPv6},
		MAC: p.MAC, HostMAC: p.HostMAC, Identity: identity, EnforceIngress: enforceIngress}
}

var pingRe = regexp.MustCompile(`(\d+) packets transmitted, (\d+) received`)

// ping sends count echo requests from p to dst, 10 ms apart, and returns
// how many were sent and answered.
func (p *labPod) ping(t *testing.T, dst netip.Addr, count int) (sent, received int) {
	t.Helper()
	out, _ := p.Command("ping", "-i", "0.01", "-c", strconv.Itoa(count), "-W", "1", dst.String()).CombinedOutput()
	m := pingRe.FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("ping output: %s", out)
	}
	sent, _ = strconv.Atoi(m[1])
	received, _ = strconv.Atoi(m[2])
	return sent, received
}

// hostTxPackets is how many packets the host sent into the pod through its
// veth: the host stack's deliveries, not the datapath's direct ones.
func (lab *podLab) hostTxPackets(p *labPod) uint64 {
	lab.t.Helper()
	n, err := lab.node.HostTxPackets(p.Pod)
	if err != nil {
		lab.t.Fatal(err)
	}
	return n
}

// tcpEcho listens on port in dst; a connection from src sends size bytes
// and reads them back. It returns the error of the exchange (connecting
// gives up after a second: a dropped SYN is an error).
func tcpEcho(dst, src *labPod, port, size int) error {
	var ln net.Listener
	if err := dst.Do(func() (err error) {
		ln, err = net.Listen("tcp", net.JoinHostPort(dst.IPv4.String(), strconv.Itoa(port)))
		return err
	}); err != nil {
		return err
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.Copy(c, c)
	}()
	var conn net.Conn
	if err := src.Do(func() (err error) {
		conn, err = net.DialTimeout("tcp", ln.Addr().String(), time.Second)
		return err
	}); err != nil {
		return err
	}
	defer conn.Close()
	payload := make([]byte, size)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := conn.Write(payload)
		errc <- err
	}()
	back := make([]byte, size)
	if _, err := io.ReadFull(conn, back); err != nil {
		return fmt.Errorf("read the echo: %w", err)
	}
	if err := <-errc; err != nil {
		return err
	}
	for i := range back {
		if back[i] != payload[i] {
			return fmt.Errorf("echo differs at byte %d", i)
		}
	}
	return nil
}

// attachModes are the modes every real-traffic test runs in.
var attachModes = []AttachMode{AttachTCX, AttachTC}

// TestPrivilegedDirectDeliveryRealTraffic: ICMP over IPv4 and IPv6 and a
// TCP stream between two pods go from one pod's program straight into the
// other pod (the host never transmits them on the receiver's veth), and
// the receiver's ingress policy is enforced on that path; with the
// programs attached in either mode.
func TestPrivilegedDirectDeliveryRealTraffic(t *testing.T) {
	for _, mode := range attachModes {
		t.Run(string(mode), func(t *testing.T) { testDirectDeliveryRealTraffic(t, mode) })
	}
}

func testDirectDeliveryRealTraffic(t *testing.T, mode AttachMode) {
	lab := newPodLab(t)
	a, b := lab.addPod("a", 0), lab.addPod("b", 1)
	l := lab.start(Config{DirectDelivery: true, AttachMode: mode})
	m := l.Maps()
	const idA, idB = 3001, 3002
	for p, id := range map[netip.Addr]uint32{a.IPv4: idA, a.IPv6: idA, b.IPv4: idB, b.IPv6: idB} {
		if err := m.IPCacheMap().Upsert(netip.PrefixFrom(p, p.BitLen()), maps.IPCacheEntry{Identity: id}); err != nil {
			t.Fatal(err)
		}
	}
	for _, ep := range []EndpointInfo{a.endpoint(1, idA, false), b.endpoint(2, idB, false)} {
		if err := l.AttachEndpoint(ep); err != nil {
			t.Fatal(err)
		}
	}
	lab.checkAttached(l, 4)
	direct := func() uint64 {
		row, err := m.MetricsMap().Lookup(maps.ReasonDeliveredDirect, maps.DirIngress)
		if err != nil {
			t.Fatal(err)
		}
		return row.Packets
	}

	const n = 20
	for _, dst := range []netip.Addr{b.IPv4, b.IPv6} {
		before, txBefore := direct(), lab.hostTxPackets(b)
		if sent, got := a.ping(t, dst, n); sent != n || got != n {
			t.Fatalf("ping %s: %d of %d answered", dst, got, sent)
		}
		t.Logf("ping %s: %d delivered directly, host sent %d into b", dst, direct()-before, lab.hostTxPackets(b)-txBefore)
		// Requests into b and replies into a.
		if d := direct() - before; d < 2*n {
			t.Errorf("ping %s: %d packets delivered directly, want >= %d", dst, d, 2*n)
		}
		if tx := lab.hostTxPackets(b) - txBefore; tx >= n {
			t.Errorf("ping %s: the host sent %d packets into b: not delivered directly", dst, tx)
		}
	}
	before := direct()
	if err := tcpEcho(b, a, 8080, 4<<20); err != nil {
		t.Fatalf("TCP echo a to b: %v", err)
	}
	t.Logf("TCP echo of 4 MiB: %d packets delivered directly", direct()-before)
	if direct()-before < 4 {
		t.Errorf("the TCP stream was not delivered directly (%d packets)", direct()-before)
	}

	// b enforces ingress with no rule: a is denied on the direct path.
	denied := func() uint64 {
		row, _ := m.MetricsMap().Lookup(maps.ReasonPolicyDenied, maps.DirIngress)
		return row.Packets
	}
	if err := l.AttachEndpoint(b.endpoint(2, idB, true)); err != nil {
		t.Fatal(err)
	}
	d0 := denied()
	if _, got := a.ping(t, b.IPv4, 3); got != 0 {
		t.Fatalf("a reached b under b's default deny (%d answers)", got)
	}
	if denied()-d0 < 3 {
		t.Errorf("b's ingress drops not counted: %d", denied()-d0)
	}
	// Echo requests from a's identity are allowed; TCP stays denied.
	if err := m.PolicyMap().Upsert(maps.PolicyKey{EndpointID: 2, Direction: maps.DirIngress, Identity: idA, Proto: 1, Port: 8, PortPrefixLen: 16}, maps.PolicyValue{}); err != nil {
		t.Fatal(err)
	}
	if sent, got := a.ping(t, b.IPv4, n); got != sent {
		t.Fatalf("ping allowed by b's rule: %d of %d answered", got, sent)
	}
	if err := tcpEcho(b, a, 8081, 1024); err == nil {
		t.Fatal("TCP to b passed although b allows only ICMP echo")
	}
	// b can still start flows to a (a enforces nothing).
	if sent, got := b.ping(t, a.IPv4, 5); got != sent {
		t.Fatalf("b to a: %d of %d answered", got, sent)
	}
}

// TestPrivilegedHostPathRealTraffic: with direct delivery off, pod to pod
// traffic goes through the host stack: the sender's from_pod checks its
// egress, the receiver's to_pod its ingress; in either attach mode.
func TestPrivilegedHostPathRealTraffic(t *testing.T) {
	for _, mode := range attachModes {
		t.Run(string(mode), func(t *testing.T) { testHostPathRealTraffic(t, mode) })
	}
}

func testHostPathRealTraffic(t *testing.T, mode AttachMode) {
	lab := newPodLab(t)
	a, b := lab.addPod("a", 0), lab.addPod("b", 1)
	l := lab.start(Config{DirectDelivery: false, AttachMode: mode})
	m := l.Maps()
	const idA, idB = 3001, 3002
	for p, id := range map[netip.Addr]uint32{a.IPv4: idA, a.IPv6: idA, b.IPv4: idB, b.IPv6: idB} {
		if err := m.IPCacheMap().Upsert(netip.PrefixFrom(p, p.BitLen()), maps.IPCacheEntry{Identity: id}); err != nil {
			t.Fatal(err)
		}
	}
	for _, ep := range []EndpointInfo{a.endpoint(1, idA, false), b.endpoint(2, idB, true)} {
		if err := l.AttachEndpoint(ep); err != nil {
			t.Fatal(err)
		}
	}
	lab.checkAttached(l, 4)
	if _, got := a.ping(t, b.IPv4, 2); got != 0 {
		t.Fatalf("a reached b under b's default deny (%d answers)", got)
	}
	for _, k := range []maps.PolicyKey{
		{EndpointID: 2, Direction: maps.DirIngress, Identity: idA, Proto: 1, Port: 8, PortPrefixLen: 16},
		{EndpointID: 2, Direction: maps.DirIngress, Identity: idA, Proto: 58, Port: 128, PortPrefixLen: 16},
		{EndpointID: 2, Direction: maps.DirIngress, Identity: idA, Proto: 6, Port: 8080, PortPrefixLen: 16},
	} {
		if err := m.PolicyMap().Upsert(k, maps.PolicyValue{}); err != nil {
			t.Fatal(err)
		}
	}
	txBefore := lab.hostTxPackets(b)
	for _, dst := range []netip.Addr{b.IPv4, b.IPv6} {
		if sent, got := a.ping(t, dst, 10); got != sent {
			t.Fatalf("ping %s through the host: %d of %d", dst, got, sent)
		}
	}
	if err := tcpEcho(b, a, 8080, 4<<20); err != nil {
		t.Fatalf("TCP echo through the host: %v", err)
	}
	if tx := lab.hostTxPackets(b) - txBefore; tx < 20 {
		t.Errorf("the host sent only %d packets into b: not the host path", tx)
	}
	if row, _ := m.MetricsMap().Lookup(maps.ReasonDeliveredDirect, maps.DirIngress); row.Packets != 0 {
		t.Errorf("%d packets delivered directly with direct delivery off", row.Packets)
	}
}
