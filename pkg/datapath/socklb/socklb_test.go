package socklb

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/bpffs"
	"github.com/tendril-net/tendril/pkg/datapath/bpf"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/loadbalancer/maglev"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// cgroupRoot is the machine's cgroup v2 mount (hybrid layout). Tests
// attach only to child cgroups they create under it, never to it.
const cgroupRoot = "/sys/fs/cgroup/unified"

type env struct {
	root   string // BPF root
	cgroup string
	lb     *SockLB
	maps   *maps.LBMaps
	events *ebpf.Map // the events ring the programs share
}

// setup makes a BPF root, loads the pod object there as the agent's loader
// would (it owns the maps), a child cgroup, and starts the socket
// load-balancer on it.
func setup(t *testing.T) *env { return setupWith(t, false) }

// setupWith is setup with the socket translation events on or off.
func setupWith(t testing.TB, traceEvents bool) *env {
	t.Helper()
	testutil.Privileged(t)
	if _, err := bpffs.EnsureMounted(); err != nil {
		t.Fatal(err)
	}
	var st unix.Statfs_t
	testutil.Require(t, unix.Statfs(cgroupRoot, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC, cgroupRoot+" is not a cgroup v2 mount")
	root, err := os.MkdirTemp("/sys/fs/bpf", "tendril-socklb-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	cg, err := os.MkdirTemp(cgroupRoot, "tendril-test-")
	if err != nil {
		t.Fatal(err)
	}
	// Registered before the loader's cleanup, so it runs after it: the
	// links are gone and the child process has exited by then.
	t.Cleanup(func() {
		if err := os.Remove(cg); err != nil {
			t.Errorf("remove test cgroup %s: %v", cg, err)
		}
	})
	var lxc bpf.LxcObjects
	if err := bpf.LoadLxcObjects(&lxc, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: root}}); err != nil {
		t.Fatalf("load pod programs: %v", err)
	}
	t.Cleanup(func() { lxc.Close() })
	lb := New(Config{BPFRoot: root, CgroupPath: cg, TraceEvents: traceEvents}, nil)
	if err := lb.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lb.Detach(); err != nil {
			t.Error(err)
		}
		lb.Close()
	})
	// The pod object's handles write what the socket hooks read: the
	// maps are shared through their pins.
	return &env{root: root, cgroup: cg, lb: lb, maps: maps.LBFromObjects(&lxc.LxcMaps), events: lxc.TdrEventsV1}
}

// service writes a frontend with backends (IDs from first on) and returns
// the backend IDs.
func (e *env) service(t *testing.T, fe maps.Frontend, svc maps.Service, first uint32, backends ...netip.AddrPort) []uint32 {
	t.Helper()
	var ids []uint32
	for i, b := range backends {
		id := first + uint32(i)
		if err := e.maps.BackendMap().Upsert(id, maps.Backend{Addr: b.Addr(), Port: b.Port()}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := e.maps.ApplyService(fe, svc, ids, 0); err != nil {
		t.Fatal(err)
	}
	return ids
}

func tcp(addr string, port uint16) maps.Frontend {
	return maps.Frontend{Addr: netip.MustParseAddr(addr), Port: port, Proto: maps.ProtoTCP}
}

func udp(addr string, port uint16) maps.Frontend {
	return maps.Frontend{Addr: netip.MustParseAddr(addr), Port: port, Proto: maps.ProtoUDP}
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

var threeTCP = []helperServer{{"127.0.0.1:9001", "b1"}, {"127.0.0.1:9002", "b2"}, {"127.0.0.1:9003", "b3"}}

func threeBackends() []netip.AddrPort {
	return []netip.AddrPort{ap("127.0.0.1:9001"), ap("127.0.0.1:9002"), ap("127.0.0.1:9003")}
}

func checkOK(t *testing.T, what string, r helperResult) {
	t.Helper()
	if r.Err != "" {
		t.Fatalf("%s: %s", what, r.Err)
	}
}

// TestPrivilegedSocketLBTranslatesTCP: connecting to a ClusterIP frontend
// reaches one of its backends, chosen at random (all three are seen over
// 30 connections: missing one has probability 3·(2/3)^30 ≈ 1.5e-5), and
// getpeername names the frontend, never the backend. A connection to a
// backend's own address is left alone, and the socket's record in
// tdr_lb_sock_revnat_v1 names the backend and the frontend.
func TestPrivilegedSocketLBTranslatesTCP(t *testing.T) {
	e := setup(t)
	e.service(t, tcp("10.96.0.10", 80), maps.Service{ID: 1, RevNATID: 1}, 1, threeBackends()...)
	res := runHelper(t, e.cgroup, helperRequest{
		TCPServers: threeTCP,
		Probes:     []helperProbe{{Kind: "tcp", Dst: "10.96.0.10:80", Count: 30}, {Kind: "tcp", Dst: "127.0.0.1:9002"}},
	})
	seen := map[string]int{}
	for i, r := range res[0] {
		checkOK(t, fmt.Sprintf("connect %d", i), r)
		if r.Peer != "10.96.0.10:80" {
			t.Errorf("connect %d: getpeername = %s, want the frontend 10.96.0.10:80", i, r.Peer)
		}
		seen[r.Reply]++
		rec, ok, err := e.maps.SockRevNATMap().Lookup(r.Cookie, ap("127.0.0.1:900"+r.Reply[1:]))
		if err != nil || !ok || rec.Frontend != ap("10.96.0.10:80") || rec.RevNATID != 1 {
			t.Errorf("connect %d: socket record = %+v, %v, %v", i, rec, ok, err)
		}
	}
	if len(seen) != 3 {
		t.Errorf("backends reached over 30 connections: %v, want all three", seen)
	}
	t.Logf("30 connections spread over the backends: %v", seen)
	direct := res[1][0]
	checkOK(t, "direct connect", direct)
	if direct.Peer != "127.0.0.1:9002" || direct.Reply != "b2" {
		t.Errorf("a connection to a backend's own address was changed: %+v", direct)
	}
}

// TestPrivilegedSocketLBTranslatesUDP: a DNS-like UDP service, unconnected
// (sendto/recvfrom) and connected: the datagram reaches the backend and the
// reply comes from the frontend's address and port.
func TestPrivilegedSocketLBTranslatesUDP(t *testing.T) {
	e := setup(t)
	e.service(t, udp("10.96.0.10", 53), maps.Service{ID: 2, RevNATID: 2}, 1, ap("127.0.0.1:5353"))
	res := runHelper(t, e.cgroup, helperRequest{
		UDPServers: []helperServer{{"127.0.0.1:5353", "dns"}},
		Probes:     []helperProbe{{Kind: "udp-unconnected", Dst: "10.96.0.10:53", Count: 3}, {Kind: "udp", Dst: "10.96.0.10:53", Count: 3}},
	})
	for i, r := range append(res[0], res[1]...) {
		checkOK(t, fmt.Sprintf("UDP probe %d", i), r)
		if r.Reply != "dns" || r.From != "10.96.0.10:53" {
			t.Errorf("UDP probe %d: reply %q from %s, want \"dns\" from 10.96.0.10:53", i, r.Reply, r.From)
		}
	}
	for i, r := range res[1] {
		if r.Peer != "10.96.0.10:53" {
			t.Errorf("connected UDP %d: getpeername = %s", i, r.Peer)
		}
	}
}

// TestPrivilegedSocketLBAffinity: with ClientIP affinity, every connection
// of a client (its network namespace) goes to one backend; the affinity
// entry names it. Once that backend terminates (out of the slots, state
// terminating), the client moves to another and stays there.
func TestPrivilegedSocketLBAffinity(t *testing.T) {
	e := setup(t)
	fe := tcp("10.96.0.11", 80)
	svc := maps.Service{ID: 3, RevNATID: 3, Flags: maps.SvcFlagAffinity, AffinityTimeout: 10800}
	ids := e.service(t, fe, svc, 10, threeBackends()...)
	res := runHelper(t, e.cgroup, helperRequest{TCPServers: threeTCP, Probes: []helperProbe{{Kind: "tcp", Dst: "10.96.0.11:80", Count: 20}}})
	first := res[0][0].Reply
	for i, r := range res[0] {
		checkOK(t, fmt.Sprintf("connect %d", i), r)
		if r.Reply != first {
			t.Fatalf("connect %d went to %s, connect 0 to %s: no affinity", i, r.Reply, first)
		}
	}
	chosen := ids[int(first[1]-'1')]
	n := 0
	err := e.maps.AffinityMap().Iterate(func(k maps.AffinityKey, a maps.Affinity) bool {
		n++
		if k.ServiceID != 3 || k.Client.IsValid() || k.NetnsCookie == 0 || a.BackendID != chosen {
			t.Errorf("affinity entry %+v -> %+v, want service 3, a netns cookie, backend %d", k, a, chosen)
		}
		return true
	})
	if err != nil || n != 1 {
		t.Fatalf("%d affinity entries (%v), want 1", n, err)
	}

	// The chosen backend terminates: the reconciler takes it out of the
	// slots and marks it; the affinity entry is not followed any more.
	var rest []uint32
	for _, id := range ids {
		if id != chosen {
			rest = append(rest, id)
		}
	}
	b, _, _ := e.maps.BackendMap().Lookup(chosen)
	b.State = maps.BackendStateTerminating
	if err := e.maps.BackendMap().Upsert(chosen, b); err != nil {
		t.Fatal(err)
	}
	if err := e.maps.ApplyService(fe, svc, rest, 3); err != nil {
		t.Fatal(err)
	}
	res = runHelper(t, e.cgroup, helperRequest{TCPServers: threeTCP, Probes: []helperProbe{{Kind: "tcp", Dst: "10.96.0.11:80", Count: 10}}})
	second := res[0][0].Reply
	if second == first {
		t.Fatalf("the client stayed on terminating backend %s", first)
	}
	for i, r := range res[0] {
		checkOK(t, fmt.Sprintf("connect %d after termination", i), r)
		if r.Reply != second {
			t.Errorf("connect %d after termination went to %s, the first to %s", i, r.Reply, second)
		}
	}
}

// TestPrivilegedSocketLBMaglev: a Maglev service sends each socket to the
// backend the Go table (pkg/loadbalancer/maglev) has at the socket's hash
// (maps.LBHashCookie of its SO_COOKIE) — checked for 40 connections, which
// must reach more than one backend.
func TestPrivilegedSocketLBMaglev(t *testing.T) {
	e := setup(t)
	backs := threeBackends()
	ids := e.service(t, tcp("10.96.0.12", 80), maps.Service{ID: 4, RevNATID: 4, Flags: maps.SvcFlagMaglev}, 20, backs...)
	var mb []maglev.Backend
	name := map[uint32]string{}
	for i, id := range ids {
		mb = append(mb, maglev.Backend{Key: backs[i].String(), ID: id, Weight: 1})
		name[id] = fmt.Sprintf("b%d", i+1)
	}
	table, err := maglev.Table(mb, maglev.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := e.maps.MaglevMap().Upsert(4, table); err != nil {
		t.Fatal(err)
	}
	res := runHelper(t, e.cgroup, helperRequest{TCPServers: threeTCP, Probes: []helperProbe{{Kind: "tcp", Dst: "10.96.0.12:80", Count: 40}}})
	seen := map[string]bool{}
	for i, r := range res[0] {
		checkOK(t, fmt.Sprintf("connect %d", i), r)
		want := name[table[maps.LBHashCookie(r.Cookie)%maps.LBMaglevTableSize]]
		if r.Reply != want {
			t.Errorf("connect %d (cookie %d) reached %s, the Maglev table says %s", i, r.Cookie, r.Reply, want)
		}
		seen[r.Reply] = true
	}
	if len(seen) < 2 {
		t.Errorf("40 sockets all reached %v", seen)
	}
}

// TestPrivilegedSocketLBNoBackend: a frontend without backends refuses
// connections (ECONNREFUSED, as kube-proxy's REJECT) and datagrams, and
// counts REASON_SVC_NO_BACKEND.
func TestPrivilegedSocketLBNoBackend(t *testing.T) {
	e := setup(t)
	e.service(t, tcp("10.96.0.13", 80), maps.Service{ID: 5, RevNATID: 5}, 1)
	e.service(t, udp("10.96.0.13", 53), maps.Service{ID: 6, RevNATID: 6}, 1)
	before, err := e.lb.Metrics().Lookup(maps.ReasonSvcNoBackend, maps.DirEgress)
	if err != nil {
		t.Fatal(err)
	}
	res := runHelper(t, e.cgroup, helperRequest{Probes: []helperProbe{
		{Kind: "tcp", Dst: "10.96.0.13:80", Count: 2}, {Kind: "udp-unconnected", Dst: "10.96.0.13:53"},
	}})
	for i, r := range append(res[0], res[1]...) {
		if r.Errno != int(unix.ECONNREFUSED) {
			t.Errorf("probe %d: %+v, want ECONNREFUSED", i, r)
		}
	}
	after, err := e.lb.Metrics().Lookup(maps.ReasonSvcNoBackend, maps.DirEgress)
	if err != nil {
		t.Fatal(err)
	}
	if got := after.Packets - before.Packets; got != 3 {
		t.Errorf("%s counted %d times, want 3", maps.ReasonName(maps.ReasonSvcNoBackend), got)
	}
}

// TestPrivilegedSocketLBIPv6: the same over IPv6: TCP and UDP to an IPv6
// frontend reach backends on ::1, getpeername and recvfrom name the
// frontend.
func TestPrivilegedSocketLBIPv6(t *testing.T) {
	e := setup(t)
	e.service(t, tcp("fd00:96::10", 80), maps.Service{ID: 7, RevNATID: 7}, 1, ap("[::1]:9001"), ap("[::1]:9002"))
	e.service(t, udp("fd00:96::10", 53), maps.Service{ID: 8, RevNATID: 8}, 3, ap("[::1]:5353"))
	res := runHelper(t, e.cgroup, helperRequest{
		TCPServers: []helperServer{{"[::1]:9001", "b1"}, {"[::1]:9002", "b2"}},
		UDPServers: []helperServer{{"[::1]:5353", "dns"}},
		Probes: []helperProbe{{Kind: "tcp", Dst: "[fd00:96::10]:80", Count: 20},
			{Kind: "udp", Dst: "[fd00:96::10]:53"}, {Kind: "udp-unconnected", Dst: "[fd00:96::10]:53"}},
	})
	seen := map[string]bool{}
	for i, r := range res[0] {
		checkOK(t, fmt.Sprintf("connect6 %d", i), r)
		if r.Peer != "[fd00:96::10]:80" {
			t.Errorf("connect6 %d: getpeername = %s", i, r.Peer)
		}
		seen[r.Reply] = true
	}
	if len(seen) != 2 {
		t.Errorf("IPv6 backends reached: %v, want both", seen)
	}
	for i, r := range append(res[1], res[2]...) {
		checkOK(t, fmt.Sprintf("UDPv6 %d", i), r)
		if r.Reply != "dns" || r.From != "[fd00:96::10]:53" {
			t.Errorf("UDPv6 %d: reply %q from %s", i, r.Reply, r.From)
		}
	}
}

// TestPrivilegedSocketLBSurvivesRestart: the hooks stay attached through
// their pinned links while no process holds them (the agent is down); a
// new start keeps the same links and swaps its programs in; Detach takes
// them off, after which the frontend is no longer translated (no route in
// the test namespace: ENETUNREACH).
func TestPrivilegedSocketLBSurvivesRestart(t *testing.T) {
	e := setup(t)
	e.service(t, tcp("10.96.0.14", 80), maps.Service{ID: 9, RevNATID: 9}, 1, ap("127.0.0.1:9001"))
	req := helperRequest{TCPServers: threeTCP[:1], Probes: []helperProbe{{Kind: "tcp", Dst: "10.96.0.14:80"}}}
	linkID := func(name string) link.ID {
		lk, err := link.LoadPinnedLink(filepath.Join(e.root, "socklb", name), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer lk.Close()
		info, err := lk.Info()
		if err != nil {
			t.Fatal(err)
		}
		return info.ID
	}
	before := linkID("connect4")
	if err := e.lb.Close(); err != nil {
		t.Fatal(err)
	}
	if r := runHelper(t, e.cgroup, req)[0][0]; r.Err != "" || r.Reply != "b1" {
		t.Fatalf("while no process holds the hooks: %+v", r)
	}
	again := New(Config{BPFRoot: e.root, CgroupPath: e.cgroup}, nil)
	if err := again.Start(); err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if st := again.Status(); st.Hooks != len(hooks) || st.Kept != len(hooks) {
		t.Errorf("restart status %+v, want %d hooks, all kept", st, len(hooks))
	}
	if after := linkID("connect4"); after != before {
		t.Errorf("connect4 link %d after restart, %d before: want the same link", after, before)
	}
	if r := runHelper(t, e.cgroup, req)[0][0]; r.Err != "" || r.Reply != "b1" || r.Peer != "10.96.0.14:80" {
		t.Fatalf("after restart: %+v", r)
	}
	if err := again.Detach(); err != nil {
		t.Fatal(err)
	}
	if r := runHelper(t, e.cgroup, req)[0][0]; r.Errno != int(unix.ENETUNREACH) {
		t.Errorf("after detach: %+v, want ENETUNREACH (untranslated)", r)
	}
}

// TestPrivilegedPodLoaderKeepsLBMaps: the pod loader's start removes pins
// under the BPF root that its object does not declare; the load-balancing
// maps are declared by it (bpf/lib/maps.h includes lbmaps.h), so a start
// of the pod datapath next to a running socket load-balancer keeps every
// one of them — the same kernel maps, with their entries — and the hooks
// keep translating.
func TestPrivilegedPodLoaderKeepsLBMaps(t *testing.T) {
	e := setup(t)
	e.service(t, tcp("10.96.0.15", 80), maps.Service{ID: 10, RevNATID: 10}, 1, ap("127.0.0.1:9001"))
	ids := map[string]ebpf.MapID{}
	for name := range socketOwnMaps(t) {
		ids[name] = pinnedMapID(t, filepath.Join(e.root, name))
	}
	l := loader.New(loader.Config{BPFRoot: e.root, AttachMode: loader.AttachTCX}, nil)
	if err := l.Start(); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for name, id := range ids {
		if got := pinnedMapID(t, filepath.Join(e.root, name)); got != id {
			t.Errorf("pin %s is map %d after the pod loader's start, %d before", name, got, id)
		}
	}
	if s, ok, _ := l.Maps().LB.ServiceMap().Lookup(tcp("10.96.0.15", 80)); !ok || s.ID != 10 {
		t.Errorf("the pod loader's handle does not see the service: %+v, %v", s, ok)
	}
	if r := runHelper(t, e.cgroup, helperRequest{TCPServers: threeTCP[:1], Probes: []helperProbe{{Kind: "tcp", Dst: "10.96.0.15:80"}}})[0][0]; r.Err != "" || r.Reply != "b1" {
		t.Errorf("after the pod loader's start: %+v", r)
	}
}

// socketOwnMaps are the pinned maps of the socket object.
func socketOwnMaps(t *testing.T) map[string]bool {
	t.Helper()
	spec, err := bpf.LoadSock()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for name, m := range spec.Maps {
		if m.Pinning == ebpf.PinByName {
			out[name] = true
		}
	}
	if !out[maps.LBSockRevNATMapName] || !out[maps.LB4ServicesMapName] {
		t.Fatalf("socket object's pinned maps %v lack the load-balancing maps", out)
	}
	return out
}

func pinnedMapID(t *testing.T, path string) ebpf.MapID {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		t.Fatalf("open pin %s: %v", path, err)
	}
	defer m.Close()
	info, err := m.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	return id
}
