// Package hubbletest holds what the tests of the Hubble server and of
// `tendril observe` share: flows from a real datapath (the pod programs
// run with BPF_PROG_TEST_RUN on crafted packets, their events read from
// the real ring buffer), a node that knows the test's pods and policies,
// and the stock hubble CLI (built by hack/hubble-cli.sh).
package hubbletest

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netns"

	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/observer"
	"github.com/tendril-net/tendril/pkg/testutil"
	"github.com/tendril-net/tendril/pkg/testutil/netlab"
)

// The test's node: two pods and a remote address.
var (
	WebIP    = netip.MustParseAddr("10.1.0.2") // shop/web-7d9f, endpoint 1
	DBIP     = netip.MustParseAddr("10.1.0.3") // data/db-0, endpoint 2
	RemoteIP = netip.MustParseAddr("192.0.2.9")
)

// Identities and policy rule cookies of the test's node.
const (
	WebIdentity   = 1000
	DBIdentity    = 1001
	WorldIdentity = 2

	AllowCookie = 7 // data/db-allow-web: web may reach db on TCP 5432
	DenyCookie  = 9 // data/db-deny-ssh: nobody reaches db on TCP 22
)

// Node is the test's NodeKnowledge.
type Node struct{ Name string }

var endpoints = []observer.Endpoint{
	{ID: 1, Identity: WebIdentity, Namespace: "shop", PodName: "web-7d9f", WorkloadName: "web", WorkloadKind: "Deployment",
		Labels: []string{"k8s:app=web", "k8s:io.kubernetes.pod.namespace=shop"}},
	{ID: 2, Identity: DBIdentity, Namespace: "data", PodName: "db-0",
		Labels: []string{"k8s:app=db", "k8s:io.kubernetes.pod.namespace=data"}},
}

// NodeName implements observer.NodeKnowledge.
func (n Node) NodeName() string { return n.Name }

// IdentityLabels implements observer.NodeKnowledge.
func (Node) IdentityLabels(id uint32) []string {
	if id == WorldIdentity {
		return []string{"reserved:world"}
	}
	for _, e := range endpoints {
		if e.Identity == id {
			return e.Labels
		}
	}
	return nil
}

// EndpointByID implements observer.NodeKnowledge.
func (Node) EndpointByID(id uint16) (observer.Endpoint, bool) {
	for _, e := range endpoints {
		if e.ID == uint32(id) {
			return e, true
		}
	}
	return observer.Endpoint{}, false
}

// EndpointByIP implements observer.NodeKnowledge.
func (Node) EndpointByIP(ip netip.Addr) (observer.Endpoint, bool) {
	switch ip {
	case WebIP:
		return endpoints[0], true
	case DBIP:
		return endpoints[1], true
	}
	return observer.Endpoint{}, false
}

// PolicyByCookie implements observer.NodeKnowledge.
func (Node) PolicyByCookie(c uint32) (observer.Policy, bool) {
	switch c {
	case AllowCookie:
		return observer.Policy{Name: "db-allow-web", Namespace: "data", Kind: "CiliumNetworkPolicy"}, true
	case DenyCookie:
		return observer.Policy{Name: "db-deny-ssh", Namespace: "data", Kind: "CiliumNetworkPolicy"}, true
	}
	return observer.Policy{}, false
}

// Packet is one crafted packet and the program it goes through.
type Packet struct {
	// FromPod: through the sending pod's from_pod; otherwise through the
	// receiving pod's to_pod.
	FromPod  bool
	Endpoint int // 1 web, 2 db: whose veth
	Src, Dst netip.Addr
	Proto    uint8
	Sport    uint16
	Dport    uint16
	TCPFlags uint8
	// Verdict is the program's expected return (0 pass, 2 drop).
	Verdict uint32
}

// Scenario is the traffic of the shared tests:
//   - web -> db TCP 5432, allowed by db-allow-web: SYN, SYN-ACK, ACK, data, FIN
//   - web -> db TCP 3306: no rule, dropped (default deny)
//   - world -> db TCP 22: dropped by the deny rule db-deny-ssh
//   - web -> world UDP 53 and its reply
func Scenario() []Packet {
	const syn, ack, psh, fin = 0x02, 0x10, 0x08, 0x01
	tcp := func(from bool, ep int, src, dst netip.Addr, sport, dport uint16, flags uint8, verdict uint32) Packet {
		return Packet{FromPod: from, Endpoint: ep, Src: src, Dst: dst, Proto: 6, Sport: sport, Dport: dport, TCPFlags: flags, Verdict: verdict}
	}
	return []Packet{
		tcp(true, 1, WebIP, DBIP, 40000, 5432, syn, 0),
		tcp(false, 2, WebIP, DBIP, 40000, 5432, syn, 0),
		tcp(true, 2, DBIP, WebIP, 5432, 40000, syn|ack, 0),
		tcp(false, 1, DBIP, WebIP, 5432, 40000, syn|ack, 0),
		tcp(true, 1, WebIP, DBIP, 40000, 5432, ack, 0),
		tcp(false, 2, WebIP, DBIP, 40000, 5432, ack, 0),
		tcp(true, 1, WebIP, DBIP, 40000, 5432, ack|psh, 0),
		tcp(false, 2, WebIP, DBIP, 40000, 5432, ack|psh, 0),
		tcp(true, 1, WebIP, DBIP, 40000, 5432, fin|ack, 0),
		tcp(false, 2, WebIP, DBIP, 40000, 5432, fin|ack, 0),
		tcp(true, 1, WebIP, DBIP, 40001, 3306, syn, 0),
		tcp(false, 2, WebIP, DBIP, 40001, 3306, syn, 2),
		tcp(false, 2, RemoteIP, DBIP, 50000, 22, syn, 2),
		{FromPod: true, Endpoint: 1, Src: WebIP, Dst: RemoteIP, Proto: 17, Sport: 5000, Dport: 53},
		{FromPod: false, Endpoint: 1, Src: RemoteIP, Dst: WebIP, Proto: 17, Sport: 53, Dport: 5000},
	}
}

// DatapathEvents loads the real datapath in a throw-away network
// namespace (per-connection trace events and policy verdict events on),
// with the test's pods, identities and policies; runs the packets
// through the pod programs (BPF_PROG_TEST_RUN), checking each verdict;
// and returns the events read from the ring buffer. Everything it made
// is gone when it returns. It needs root (testutil.Privileged).
func DatapathEvents(t testing.TB, pkts []Packet) []loader.Event {
	t.Helper()
	return ServiceEvents(t, pkts, nil)
}

// ServiceBackend is a service frontend (a cluster IP and port, TCP) and
// its one backend, as the datapath's load-balancing maps hold them.
type ServiceBackend struct {
	Frontend, Backend netip.AddrPort
}

// ServiceEvents is DatapathEvents with services in the datapath: a pod's
// packet to a frontend is translated to its backend by from_pod (the
// per-packet path), and the backend's reply back.
func ServiceEvents(t testing.TB, pkts []Packet, services []ServiceBackend) []loader.Event {
	t.Helper()
	testutil.Privileged(t)
	if _, err := os.Stat("/sys/fs/bpf"); err != nil {
		t.Fatalf("bpffs: %v", err)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.New()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := netns.Set(orig); err != nil {
			t.Errorf("return to the original network namespace: %v", err)
		}
		ns.Close()
	}()
	ifindex := []int{0, netlab.AddVeth(t, "tdrhub1", "tdrhubp1"), netlab.AddVeth(t, "tdrhub2", "tdrhubp2")}

	b := make([]byte, 4)
	_, _ = rand.Read(b)
	root := filepath.Join("/sys/fs/bpf", "tendril-hubbletest-"+hex.EncodeToString(b))
	l := loader.New(loader.Config{BPFRoot: root, PolicyVerdictEvents: true, TraceEvents: loader.TracePerConnection}, nil)
	defer func() {
		if err := l.Remove(); err != nil {
			t.Errorf("remove the test datapath: %v", err)
		}
	}()
	if err := l.Start(); err != nil {
		t.Fatal(err)
	}
	for _, ep := range []loader.EndpointInfo{
		{ID: 1, IfIndex: ifindex[1], IfName: "tdrhub1", Addresses: []netip.Addr{WebIP}, Identity: WebIdentity, EnforceIngress: true},
		{ID: 2, IfIndex: ifindex[2], IfName: "tdrhub2", Addresses: []netip.Addr{DBIP}, Identity: DBIdentity, EnforceIngress: true},
	} {
		if err := l.AttachEndpoint(ep); err != nil {
			t.Fatal(err)
		}
	}
	m := l.Maps()
	for p, id := range map[string]uint32{"10.1.0.2/32": WebIdentity, "10.1.0.3/32": DBIdentity} {
		if err := m.IPCacheMap().Upsert(netip.MustParsePrefix(p), maps.IPCacheEntry{Identity: id}); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range []struct {
		k maps.PolicyKey
		v maps.PolicyValue
	}{
		{maps.PolicyKey{EndpointID: 2, Direction: maps.DirIngress, Identity: WebIdentity, Proto: 6, Port: 5432, PortPrefixLen: 16}, maps.PolicyValue{Cookie: AllowCookie}},
		{maps.PolicyKey{EndpointID: 2, Direction: maps.DirIngress, Identity: WorldIdentity, Proto: 6, Port: 22, PortPrefixLen: 16}, maps.PolicyValue{Deny: true, Cookie: DenyCookie}},
	} {
		if err := m.PolicyMap().Upsert(r.k, r.v); err != nil {
			t.Fatal(err)
		}
	}
	for i, s := range services {
		id := uint32(i + 1)
		if err := m.LB.BackendMap().Upsert(id, maps.Backend{Addr: s.Backend.Addr(), Port: s.Backend.Port()}); err != nil {
			t.Fatal(err)
		}
		fe := maps.Frontend{Addr: s.Frontend.Addr(), Port: s.Frontend.Port(), Proto: maps.ProtoTCP}
		if err := m.LB.ApplyService(fe, maps.Service{ID: id, RevNATID: id}, []uint32{id}, 0); err != nil {
			t.Fatal(err)
		}
	}
	er, err := l.NewEventReader()
	if err != nil {
		t.Fatal(err)
	}
	defer er.Close()
	from, to := l.Programs()
	for i, p := range pkts {
		prog := to
		if p.FromPod {
			prog = from
		}
		if got := run(t, prog, ifindex[p.Endpoint], Frame(p)); got != p.Verdict {
			t.Fatalf("packet %d (%+v): verdict %d, want %d", i, p, got, p.Verdict)
		}
	}
	var evs []loader.Event
	for {
		er.SetDeadline(time.Now().Add(200 * time.Millisecond))
		ev, err := er.Read()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
	if lost, err := l.EventsLost(); err != nil || lost.Total() != 0 {
		t.Fatalf("events lost: %+v, %v", lost, err)
	}
	return evs
}

// run runs a program on a frame with the context's ifindex set (struct
// __sk_buff's eleventh word).
func run(t testing.TB, prog *ebpf.Program, ifindex int, frame []byte) uint32 {
	t.Helper()
	var ctx [11]uint32
	ctx[10] = uint32(ifindex)
	ret, err := prog.Run(&ebpf.RunOptions{Data: frame, Context: ctx})
	if err != nil {
		t.Fatalf("test run: %v", err)
	}
	return ret
}

// Frame builds an Ethernet + IPv4 + TCP/UDP frame (no checksum is
// checked by the programs; the IPv4 header's is right anyway).
func Frame(p Packet) []byte {
	var l4 []byte
	if p.Proto == 6 {
		l4 = make([]byte, 20)
		l4[12] = 5 << 4
		l4[13] = p.TCPFlags
	} else {
		l4 = make([]byte, 8)
		binary.BigEndian.PutUint16(l4[4:], 8)
	}
	binary.BigEndian.PutUint16(l4[0:], p.Sport)
	binary.BigEndian.PutUint16(l4[2:], p.Dport)
	ip := testutil.IPv4Header(p.Src, p.Dst, p.Proto, 64, len(l4))
	eth := []byte{2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x08, 0x00}
	frame := append(append(eth, ip...), l4...)
	for len(frame) < 60 {
		frame = append(frame, 0)
	}
	return frame
}

// HubbleCLI returns the stock hubble CLI (hack/hubble-cli.sh caches it
// under ~/.cache/tendril/bin). Under CI=true the script builds it when it
// is missing; elsewhere the test skips then (a cold build takes minutes).
func HubbleCLI(t testing.TB) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "..", "..", "hack", "hubble-cli.sh")
	out, err := exec.Command(script, "--print-path").Output()
	if err != nil {
		t.Fatalf("%s --print-path: %v", script, err)
	}
	path := strings.TrimSpace(string(out))
	if _, err := os.Stat(path); err != nil && testutil.InCI() {
		cmd := exec.Command(script)
		cmd.Stderr = os.Stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("build the hubble CLI: %v", err)
		}
	}
	_, err = os.Stat(path)
	testutil.Require(t, err == nil, "the stock hubble CLI is not built: run hack/hubble-cli.sh")
	return path
}
