package loader

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

// attachedProgram is one attachment found on the lab's interfaces.
type attachedProgram struct {
	ifindex int
	prog    ebpf.ProgramID
	// direct is a tc filter's direct-action flag (always true for TCX).
	direct bool
}

// attachments lists what is attached in the lab, read from the kernel:
// the pinned TCX links under the lab's root and Tendril's tc filters on
// every interface of the node, each by attachment name (ep<ID>-<dir>).
func (lab *podLab) attachments() (pins, filters map[string]attachedProgram) {
	lab.t.Helper()
	pins, filters = map[string]attachedProgram{}, map[string]attachedProgram{}
	entries, err := os.ReadDir(filepath.Join(lab.root, "links"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		lab.t.Fatal(err)
	}
	for _, e := range entries {
		lk, err := link.LoadPinnedLink(filepath.Join(lab.root, "links", e.Name()), nil)
		if err != nil {
			lab.t.Fatal(err)
		}
		info, err := lk.Info()
		lk.Close()
		if err != nil {
			lab.t.Fatal(err)
		}
		pins[e.Name()] = attachedProgram{ifindex: int(info.TCX().Ifindex), prog: info.Program, direct: true}
	}
	links, err := netlink.LinkList()
	if err != nil {
		lab.t.Fatal(err)
	}
	for _, lk := range links {
		for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
			fs, err := netlink.FilterList(lk, parent)
			if err != nil {
				continue // no clsact qdisc
			}
			for _, f := range fs {
				if tf, ok := parseTCFilter(f, parent); ok {
					bf := f.(*netlink.BpfFilter)
					if bf.Protocol != unix.ETH_P_ALL {
						lab.t.Errorf("filter %s has protocol %#x, want all", bf.Name, bf.Protocol)
					}
					filters[tf.name()] = attachedProgram{ifindex: tf.ifindex, prog: ebpf.ProgramID(bf.Id), direct: bf.DirectAction}
				}
			}
		}
	}
	return pins, filters
}

func programID(t testing.TB, p *ebpf.Program) ebpf.ProgramID {
	t.Helper()
	info, err := p.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, ok := info.ID()
	if !ok {
		t.Fatal("no program ID")
	}
	return id
}

// checkAttached checks that n attachments, all of l's mode, run l's
// programs (ingress from_pod, egress to_pod), and that none of the other
// mode is left; l's status agrees.
func (lab *podLab) checkAttached(l *Loader, n int) {
	lab.t.Helper()
	pins, filters := lab.attachments()
	mine, other := pins, filters
	if l.cfg.AttachMode == AttachTC {
		mine, other = filters, pins
	}
	if len(mine) != n || len(other) != 0 {
		lab.t.Errorf("%s mode: %d attachments of the mode (want %d), %d of the other: pins %v, filters %v",
			l.cfg.AttachMode, len(mine), n, len(other), pins, filters)
	}
	from, to := l.Programs()
	want := map[string]ebpf.ProgramID{dirIngress: programID(lab.t, from), dirEgress: programID(lab.t, to)}
	for name, a := range mine {
		_, dir, _ := parseLinkName(name)
		if a.prog != want[dir] || !a.direct {
			lab.t.Errorf("%s runs program %d (direct action %v), want this run's %d", name, a.prog, a.direct, want[dir])
		}
	}
	if st := l.Status(); st.Links != n || st.AttachMode != l.cfg.AttachMode {
		lab.t.Errorf("status: %d links in mode %s, want %d in %s", st.Links, st.AttachMode, n, l.cfg.AttachMode)
	}
}

// pingResult is the outcome of a ping run in the background.
type pingResult struct {
	sent, received int
	out            string
}

// pingAsync starts count echo requests from p to dst, 10 ms apart.
func (p *labPod) pingAsync(dst netip.Addr, count int) <-chan pingResult {
	done := make(chan pingResult, 1)
	go func() {
		out, _ := p.Command("ping", "-i", "0.01", "-c", strconv.Itoa(count), "-W", "1", dst.String()).CombinedOutput()
		r := pingResult{out: string(out)}
		if m := pingRe.FindStringSubmatch(r.out); m != nil {
			r.sent, _ = strconv.Atoi(m[1])
			r.received, _ = strconv.Atoi(m[2])
		}
		done <- r
	}()
	return done
}

// udpFlood sends UDP datagrams from p to dst:port, one per 100 µs,
// until stop is closed, and then reports how many it sent.
func (p *labPod) udpFlood(t *testing.T, dst netip.Addr, port int, stop <-chan struct{}) <-chan int {
	t.Helper()
	var conn net.Conn
	if err := p.Do(func() (err error) {
		conn, err = net.Dial("udp", net.JoinHostPort(dst.String(), strconv.Itoa(port)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	done := make(chan int, 1)
	go func() {
		defer conn.Close()
		tick := time.NewTicker(100 * time.Microsecond)
		defer tick.Stop()
		n := 0
		for {
			select {
			case <-stop:
				done <- n
				return
			case <-tick.C:
				if _, err := conn.Write([]byte("denied")); err == nil {
					n++
				}
			}
		}
	}()
	return done
}

// udpCount listens on port in p for the rest of the test; the function
// it returns reads how many datagrams arrived so far.
func (p *labPod) udpCount(t *testing.T, port int) func() int64 {
	t.Helper()
	var pc net.PacketConn
	if err := p.Do(func() (err error) {
		pc, err = net.ListenPacket("udp", net.JoinHostPort(p.IPv4.String(), strconv.Itoa(port)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	var n atomic.Int64
	go func() {
		buf := make([]byte, 64)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
			n.Add(1)
		}
	}()
	return n.Load
}

// rxPackets is how many packets p sent into the node (its host veth's
// receive counter), whatever the programs did with them.
func (lab *podLab) rxPackets(p *labPod) uint64 {
	lab.t.Helper()
	lk, err := netlink.LinkByIndex(p.HostIfIndex)
	if err != nil {
		lab.t.Fatal(err)
	}
	return lk.Attrs().Statistics.RxPackets
}

// waitSent waits until p has sent n more packets: a running ping is
// under way. The bound only stops a broken datapath from hanging.
func (lab *podLab) waitSent(p *labPod, n uint64) {
	lab.t.Helper()
	start := lab.rxPackets(p)
	for i := 0; lab.rxPackets(p) < start+n; i++ {
		if i == 1000 {
			lab.t.Fatalf("%s sent fewer than %d packets in 10 s", p.Name, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

const idA3, idB3, idC3 = 3001, 3002, 3003

// policyPods wires three pods into l: a and c enforce nothing, b admits
// echo requests from a only. It returns their endpoints (IDs 1-3).
func policyPods(t *testing.T, l *Loader, a, b, c *labPod) []EndpointInfo {
	t.Helper()
	m := l.Maps()
	for p, id := range map[*labPod]uint32{a: idA3, b: idB3, c: idC3} {
		for _, ip := range []netip.Addr{p.IPv4, p.IPv6} {
			if err := m.IPCacheMap().Upsert(netip.PrefixFrom(ip, ip.BitLen()), maps.IPCacheEntry{Identity: id}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, k := range []maps.PolicyKey{
		{EndpointID: 2, Direction: maps.DirIngress, Identity: idA3, Proto: 1, Port: 8, PortPrefixLen: 16},
		{EndpointID: 2, Direction: maps.DirIngress, Identity: idA3, Proto: 58, Port: 128, PortPrefixLen: 16},
	} {
		if err := m.PolicyMap().Upsert(k, maps.PolicyValue{}); err != nil {
			t.Fatal(err)
		}
	}
	eps := []EndpointInfo{a.endpoint(1, idA3, false), b.endpoint(2, idB3, true), c.endpoint(3, idC3, false)}
	regenerate(t, l, eps)
	return eps
}

func regenerate(t *testing.T, l *Loader, eps []EndpointInfo) {
	t.Helper()
	for _, ep := range eps {
		if err := l.AttachEndpoint(ep); err != nil {
			t.Fatal(err)
		}
	}
}

// checkDenied checks that c cannot reach b (b's policy admits a only).
func checkDenied(t *testing.T, c, b *labPod, when string) {
	t.Helper()
	if _, got := c.ping(t, b.IPv4, 2); got != 0 {
		t.Errorf("%s: c reached b against b's policy", when)
	}
}

func checkNoLoss(t *testing.T, r pingResult, count int, what string) {
	t.Helper()
	t.Logf("ping %s: %d sent, %d received", what, r.sent, r.received)
	if r.sent != count || r.received != count {
		t.Errorf("ping %s lost %d of %d:\n%s", what, r.sent-r.received, count, r.out)
	}
}

// TestPrivilegedRestartKeepsTraffic: in either mode, the programs stay
// attached while no loader runs (b's policy still enforced), a new loader
// takes the attachments over with its own programs (atomically: a 100/s
// ping across the restart loses nothing), DetachEndpoint takes one
// endpoint's programs off and Remove everything.
func TestPrivilegedRestartKeepsTraffic(t *testing.T) {
	for _, mode := range attachModes {
		t.Run(string(mode), func(t *testing.T) { testRestartKeepsTraffic(t, mode) })
	}
}

func testRestartKeepsTraffic(t *testing.T, mode AttachMode) {
	lab := newPodLab(t)
	a, b, c := lab.addPod("a", 0), lab.addPod("b", 1), lab.addPod("c", 2)
	cfg := Config{DirectDelivery: true, AttachMode: mode}
	l1 := lab.start(cfg)
	eps := policyPods(t, l1, a, b, c)
	lab.checkAttached(l1, 6)
	checkDenied(t, c, b, "first run")

	const count = 300
	ping := a.pingAsync(b.IPv4, count)
	lab.waitSent(a, 50)
	if err := l1.Close(); err != nil {
		t.Fatal(err)
	}
	checkDenied(t, c, b, "no loader")
	l2 := lab.start(cfg)
	if st := l2.Status(); st.ReusedLinks != 6 {
		t.Errorf("%d attachments taken over, want 6", st.ReusedLinks)
	}
	lab.checkAttached(l2, 6)
	regenerate(t, l2, eps)
	lab.checkAttached(l2, 6)
	checkNoLoss(t, <-ping, count, "across the restart")
	checkDenied(t, c, b, "second run")

	if err := l2.DetachEndpoint(3, nil); err != nil {
		t.Fatal(err)
	}
	lab.checkAttached(l2, 4)
	if got := l2.AttachedEndpoints(); len(got) != 2 || got[0] != 1 || got[1] != 2 {
		t.Errorf("attached endpoints after detaching 3: %v", got)
	}
	if sent, got := a.ping(t, b.IPv4, 5); got != sent {
		t.Errorf("a to b after detaching c: %d of %d", got, sent)
	}
	if err := l2.Remove(); err != nil {
		t.Fatal(err)
	}
	if pins, filters := lab.attachments(); len(pins)+len(filters) != 0 {
		t.Errorf("after Remove: pins %v, filters %v", pins, filters)
	}
}

// TestPrivilegedAttachModeSwitch: restarts switch the node from TCX to tc
// and back under a 100/s ping: each endpoint gets the new mode's
// attachment before it loses the old one, so nothing is lost; b's policy
// holds after each switch; no attachment of the old mode is left. With
// direct delivery (from_pod redirects) and without (from_pod passes the
// packet on: the case where a second program could see it again).
func TestPrivilegedAttachModeSwitch(t *testing.T) {
	for _, direct := range []bool{true, false} {
		name := "direct"
		if !direct {
			name = "host-path"
		}
		t.Run(name, func(t *testing.T) { testAttachModeSwitch(t, direct) })
	}
}

func testAttachModeSwitch(t *testing.T, direct bool) {
	lab := newPodLab(t)
	a, b, c := lab.addPod("a", 0), lab.addPod("b", 1), lab.addPod("c", 2)
	l := lab.start(Config{DirectDelivery: direct, AttachMode: AttachTCX})
	eps := policyPods(t, l, a, b, c)
	lab.checkAttached(l, 6)

	const count = 600
	ping := a.pingAsync(b.IPv4, count)
	received := b.udpCount(t, 9999)
	for _, mode := range []AttachMode{AttachTC, AttachTCX} {
		lab.waitSent(a, 50)
		// c floods b during the switch: a moment with no program would
		// let its datagrams through unchecked, to b's socket.
		stop := make(chan struct{})
		sent := c.udpFlood(t, b.IPv4, 9999, stop)
		lab.waitSent(c, 100)
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		l = lab.start(Config{DirectDelivery: direct, AttachMode: mode})
		if st := l.Status(); st.ReusedLinks != 6 {
			t.Errorf("to %s: %d attachments taken over, want 6", mode, st.ReusedLinks)
		}
		lab.checkAttached(l, 6)
		regenerate(t, l, eps)
		lab.checkAttached(l, 6)
		close(stop)
		n := <-sent
		if got := received(); got != 0 {
			t.Errorf("switch to %s: %d of c's %d denied datagrams reached b", mode, got, n)
		} else {
			t.Logf("switch to %s: c's %d denied datagrams all dropped", mode, n)
		}
	}
	checkNoLoss(t, <-ping, count, "across two mode switches")
	if sent, got := a.ping(t, b.IPv6, 5); got != sent {
		t.Errorf("a to b over IPv6 after the switches: %d of %d", got, sent)
	}
}

// TestPrivilegedTCXRunsBeforeTC: while an interface has both a TCX link
// and a tc filter (the moment of a switch), only the TCX program sees the
// packets: the kernel runs tc filters only when the TCX programs say
// "next", which Tendril's never do. Checked on the host path, where
// from_pod passes packets on (TC_ACT_OK), with the programs' run counts.
// Once the TCX links go, the tc programs take over.
func TestPrivilegedTCXRunsBeforeTC(t *testing.T) {
	lab := newPodLab(t)
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		t.Fatal(err)
	}
	defer stats.Close()
	a, b := lab.addPod("a", 0), lab.addPod("b", 1)
	l := lab.start(Config{DirectDelivery: false, AttachMode: AttachTC})
	for p, id := range map[*labPod]uint32{a: idA3, b: idB3} {
		if err := l.Maps().IPCacheMap().Upsert(netip.PrefixFrom(p.IPv4, 32), maps.IPCacheEntry{Identity: id}); err != nil {
			t.Fatal(err)
		}
	}
	regenerate(t, l, []EndpointInfo{a.endpoint(1, idA3, false), b.endpoint(2, idB3, false)})
	tcFrom, tcTo := l.Programs()

	// A second copy of the programs on the same pinned maps, on TCX links,
	// as the run before a switch leaves them.
	spec, err := bpf.LoadLxc()
	if err != nil {
		t.Fatal(err)
	}
	var objs bpf.LxcObjects
	if err := spec.LoadAndAssign(&objs, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: lab.root}}); err != nil {
		t.Fatal(err)
	}
	defer objs.Close()
	var tcx []link.Link
	for _, p := range []*labPod{a, b} {
		for prog, attach := range map[*ebpf.Program]ebpf.AttachType{objs.FromPod: ebpf.AttachTCXIngress, objs.ToPod: ebpf.AttachTCXEgress} {
			lk, err := link.AttachTCX(link.TCXOptions{Interface: p.HostIfIndex, Program: prog, Attach: attach})
			if err != nil {
				t.Fatal(err)
			}
			tcx = append(tcx, lk)
		}
	}
	runs := func(p *ebpf.Program) uint64 {
		st, err := p.Stats()
		if err != nil {
			t.Fatal(err)
		}
		return st.RunCount
	}
	progs := []*ebpf.Program{objs.FromPod, objs.ToPod, tcFrom, tcTo}
	count := func() []uint64 {
		out := make([]uint64, len(progs))
		for i, p := range progs {
			out[i] = runs(p)
		}
		return out
	}
	rx0 := lab.rxPackets(a) + lab.rxPackets(b)
	before := count()
	const n = 20
	if sent, got := a.ping(t, b.IPv4, n); got != sent {
		t.Fatalf("ping with both attached: %d of %d", got, sent)
	}
	after := count()
	rx := lab.rxPackets(a) + lab.rxPackets(b) - rx0
	t.Logf("both attached: TCX from_pod %d runs, to_pod %d; tc from_pod %d, to_pod %d; pods sent %d",
		after[0]-before[0], after[1]-before[1], after[2]-before[2], after[3]-before[3], rx)
	if after[0]-before[0] < 2*n || after[1]-before[1] < 2*n {
		t.Errorf("the TCX programs ran %d/%d times for %d echo exchanges", after[0]-before[0], after[1]-before[1], n)
	}
	if after[0]-before[0] != rx {
		t.Errorf("TCX from_pod ran %d times for %d packets from the pods", after[0]-before[0], rx)
	}
	if after[2] != before[2] || after[3] != before[3] {
		t.Errorf("the tc programs ran too (from_pod %d, to_pod %d times)", after[2]-before[2], after[3]-before[3])
	}

	for _, lk := range tcx {
		if err := lk.Close(); err != nil {
			t.Fatal(err)
		}
	}
	before = count()
	if sent, got := a.ping(t, b.IPv4, n); got != sent {
		t.Fatalf("ping after the TCX links went: %d of %d", got, sent)
	}
	after = count()
	if after[0] != before[0] || after[2]-before[2] < 2*n || after[3]-before[3] < 2*n {
		t.Errorf("after the TCX links went: TCX from_pod %d runs, tc from_pod %d, to_pod %d",
			after[0]-before[0], after[2]-before[2], after[3]-before[3])
	}
}

// TestPrivilegedTCFiltersOfOthersLeftAlone: filters of other components
// are neither taken over, replaced nor deleted: one at another priority
// stays beside Tendril's, one holding Tendril's priority makes the attach
// fail instead of being overwritten.
func TestPrivilegedTCFiltersOfOthersLeftAlone(t *testing.T) {
	lab := newPodLab(t)
	a, b := lab.addPod("a", 0), lab.addPod("b", 1)
	l := lab.start(Config{DirectDelivery: true, AttachMode: AttachTC})
	_, toPod := l.Programs()
	foreign := func(p *labPod, prio uint16, name string) *netlink.BpfFilter {
		return &netlink.BpfFilter{
			FilterAttrs: netlink.FilterAttrs{LinkIndex: p.HostIfIndex, Parent: netlink.HANDLE_MIN_EGRESS, Handle: 7, Priority: prio, Protocol: unix.ETH_P_ALL},
			Fd:          toPod.FD(), Name: name, DirectAction: true,
		}
	}
	for _, p := range []*labPod{a, b} {
		if err := netlink.QdiscAdd(&netlink.Clsact{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: p.HostIfIndex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}}); err != nil {
			t.Fatal(err)
		}
	}
	// a: another's filter at priority 5; b: another's filter at priority 1.
	if err := netlink.FilterAdd(foreign(a, 5, "other")); err != nil {
		t.Fatal(err)
	}
	if err := netlink.FilterAdd(foreign(b, tcFilterPriority, "tendril-lookalike")); err != nil {
		t.Fatal(err)
	}
	if err := l.AttachEndpoint(a.endpoint(1, idA3, false)); err != nil {
		t.Fatalf("attach next to another's filter: %v", err)
	}
	err := l.AttachEndpoint(b.endpoint(2, idB3, false))
	if err == nil || !strings.Contains(err.Error(), "tendril-lookalike") {
		t.Fatalf("attach where another's filter holds Tendril's priority: %v", err)
	}
	t.Logf("refused: %v", err)
	others := func() int {
		n := 0
		for _, p := range []*labPod{a, b} {
			fs, err := netlink.FilterList(ifaceRef(p.HostIfIndex), netlink.HANDLE_MIN_EGRESS)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range fs {
				if bf, ok := f.(*netlink.BpfFilter); ok && (bf.Name == "other" || bf.Name == "tendril-lookalike") {
					n++
				}
			}
		}
		return n
	}
	if n := others(); n != 2 {
		t.Errorf("%d of the other filters left after attaching, want 2", n)
	}
	// A restart takes over only Tendril's filter; detach removes only it.
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = lab.start(Config{DirectDelivery: true, AttachMode: AttachTC})
	if st := l.Status(); st.ReusedLinks != 2 {
		t.Errorf("%d filters taken over, want a's 2", st.ReusedLinks)
	}
	if err := l.DetachEndpoint(1, nil); err != nil {
		t.Fatal(err)
	}
	if n := others(); n != 2 {
		t.Errorf("%d of the other filters left after detaching, want 2", n)
	}
	if _, filters := lab.attachments(); len(filters) != 0 {
		t.Errorf("Tendril's filters left after detaching: %v", filters)
	}
}

// TestPrivilegedAttachmentOfVanishedInterface: a pod's veth deleted while
// no loader runs leaves, in TCX mode, a pinned link attached to nothing
// (which the kernel refuses to update): the next start removes it instead
// of failing, in either mode, and takes the others over.
func TestPrivilegedAttachmentOfVanishedInterface(t *testing.T) {
	for _, from := range attachModes {
		for _, to := range attachModes {
			t.Run(string(from)+"-to-"+string(to), func(t *testing.T) {
				lab := newPodLab(t)
				a, b, c := lab.addPod("a", 0), lab.addPod("b", 1), lab.addPod("c", 2)
				l := lab.start(Config{DirectDelivery: true, AttachMode: from})
				eps := policyPods(t, l, a, b, c)
				if err := l.Close(); err != nil {
					t.Fatal(err)
				}
				hostIf, err := lab.node.Handle.LinkByIndex(c.HostIfIndex)
				if err != nil {
					t.Fatal(err)
				}
				if err := lab.node.Handle.LinkDel(hostIf); err != nil {
					t.Fatal(err)
				}
				l = lab.start(Config{DirectDelivery: true, AttachMode: to})
				if st := l.Status(); st.ReusedLinks != 4 {
					t.Errorf("%d attachments taken over, want a's and b's 4", st.ReusedLinks)
				}
				lab.checkAttached(l, 4)
				regenerate(t, l, eps[:2])
				if err := l.DetachEndpoint(3, nil); err != nil {
					t.Errorf("detach the endpoint whose veth is gone: %v", err)
				}
				if sent, got := a.ping(t, b.IPv4, 5); got != sent {
					t.Errorf("a to b: %d of %d", got, sent)
				}
			})
		}
	}
}

// TestPrivilegedDeferredTCXPromotion: in TCX mode with DeferTCX, new
// endpoints are attached by tc filters at once (enforcing from the first
// packet) and moved to TCX links once no endpoint has been attached for
// the quiet period, during a 100/s ping and a flood of denied datagrams:
// nothing is lost, nothing denied gets through, and every endpoint ends on
// TCX links alone. A re-attach while pending keeps the filters; a detach
// drops the endpoint from the pending set.
func TestPrivilegedDeferredTCXPromotion(t *testing.T) {
	lab := newPodLab(t)
	a, b, c := lab.addPod("a", 0), lab.addPod("b", 1), lab.addPod("c", 2)
	cfg := Config{DirectDelivery: true, AttachMode: AttachTCX, DeferTCX: true, TCXQuietPeriod: 300 * time.Millisecond}
	l := lab.start(cfg)
	eps := policyPods(t, l, a, b, c)
	pins, filters := lab.attachments()
	if len(pins) != 0 || len(filters) != 6 {
		t.Fatalf("right after the attach: %d pins and %d tc filters, want 0 and 6", len(pins), len(filters))
	}
	if got := l.PendingTCX(); got != 3 {
		t.Fatalf("%d endpoints pending TCX, want 3", got)
	}
	checkDenied(t, c, b, "on tc filters")
	regenerate(t, l, eps) // a regeneration while pending: still filters
	if got := l.PendingTCX(); got != 3 {
		t.Fatalf("after a regeneration %d endpoints pending TCX, want 3", got)
	}

	const count = 300
	ping := a.pingAsync(b.IPv4, count)
	received := b.udpCount(t, 9999)
	lab.waitSent(a, 50)
	stop := make(chan struct{})
	sent := c.udpFlood(t, b.IPv4, 9999, stop)
	lab.waitSent(c, 100)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.RunTCXPromotion(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	deadline := time.Now().Add(10 * time.Second)
	for l.PendingTCX() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d endpoints still pending TCX after 10 s", l.PendingTCX())
		}
		time.Sleep(20 * time.Millisecond)
	}
	lab.checkAttached(l, 6)
	close(stop)
	n := <-sent
	if got := received(); got != 0 {
		t.Errorf("%d of c's %d denied datagrams reached b during the promotion", got, n)
	}
	checkNoLoss(t, <-ping, count, "during the promotion to TCX")
	checkDenied(t, c, b, "on TCX links")

	// A regeneration on TCX links updates them: nothing goes pending.
	regenerate(t, l, eps)
	if got := l.PendingTCX(); got != 0 {
		t.Errorf("a regeneration on TCX links made %d endpoints pending", got)
	}
	lab.checkAttached(l, 6)
	// A detach while pending forgets the endpoint.
	if err := l.DetachEndpoint(eps[2].ID, nil); err != nil {
		t.Fatal(err)
	}
	if got := l.PendingTCX(); got != 0 {
		t.Errorf("%d pending after the detach", got)
	}
}

// TestPrivilegedCheckEndpointPutsBackWhatOthersRemoved: in either mode,
// programs someone else took off a pod's veth (tc: a deleted filter, a
// deleted clsact qdisc; TCX: a detached link) are attached again by
// CheckEndpoint, which says so, while an intact endpoint is left as it
// is; b's policy holds again afterwards.
func TestPrivilegedCheckEndpointPutsBackWhatOthersRemoved(t *testing.T) {
	for _, mode := range attachModes {
		t.Run(string(mode), func(t *testing.T) {
			lab := newPodLab(t)
			a, b, c := lab.addPod("a", 0), lab.addPod("b", 1), lab.addPod("c", 2)
			l := lab.start(Config{DirectDelivery: true, AttachMode: mode})
			eps := policyPods(t, l, a, b, c)
			switch mode {
			case AttachTC:
				// b's egress filter (its ingress policy on the host path)
				// and c's whole qdisc (its ingress filter with it).
				if err := netlink.FilterDel(l.bpfFilter(tcFilter{ifindex: b.HostIfIndex, id: 2, dir: dirEgress}, -1)); err != nil {
					t.Fatal(err)
				}
				if err := netlink.QdiscDel(&netlink.Clsact{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: c.HostIfIndex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}}); err != nil {
					t.Fatal(err)
				}
			default:
				for _, name := range []string{"ep2-egress", "ep3-ingress"} {
					lk, err := link.LoadPinnedLink(filepath.Join(lab.root, "links", name), nil)
					if err != nil {
						t.Fatal(err)
					}
					err = lk.Detach()
					lk.Close()
					if err != nil {
						t.Fatalf("detach %s: %v", name, err)
					}
				}
			}
			if _, got := c.ping(t, b.IPv4, 2); got != 0 {
				t.Logf("with b's and c's programs gone, c reached b against b's policy (%d of 2): fail open until the check", got)
			}
			for i, ep := range eps {
				reattached, err := l.CheckEndpoint(ep)
				if err != nil {
					t.Fatalf("check endpoint %d: %v", ep.ID, err)
				}
				if want := i > 0; reattached != want {
					t.Errorf("check endpoint %d: reattached %v, want %v", ep.ID, reattached, want)
				}
			}
			lab.checkAttached(l, 6)
			checkDenied(t, c, b, "after the check")
			if sent, got := a.ping(t, b.IPv4, 5); got != sent {
				t.Errorf("a to b after the check: %d of %d", got, sent)
			}
			// Nothing is missing now: a second check changes nothing.
			for _, ep := range eps {
				if reattached, err := l.CheckEndpoint(ep); err != nil || reattached {
					t.Errorf("second check of endpoint %d: reattached %v, %v", ep.ID, reattached, err)
				}
			}
		})
	}
}
