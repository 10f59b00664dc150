package prefilter

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/agent/hostdev"
	"github.com/tendril-net/tendril/pkg/bpffs"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	dpprefilter "github.com/tendril-net/tendril/pkg/datapath/prefilter"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/prefilter"
	"github.com/tendril-net/tendril/pkg/testutil"
	"github.com/tendril-net/tendril/pkg/testutil/netlab"
)

var (
	nodeAddr  = netip.MustParseAddr("192.0.2.1")
	worldAddr = netip.MustParseAddr("192.0.2.2")
	// denied is the world's second address, in the prefiltered CIDR.
	denied = netip.MustParseAddr("198.51.100.7")
)

// runCount is how often the program behind the pinned link ran (BPF
// stats must be on).
func runCount(t *testing.T, pin string) uint64 {
	t.Helper()
	l, err := link.LoadPinnedLink(pin, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		t.Fatal(err)
	}
	prog, err := ebpf.NewProgramFromID(ebpf.ProgramID(info.Program))
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	st, err := prog.Stats()
	if err != nil {
		t.Fatal(err)
	}
	return st.RunCount
}

// TestPrivilegedPrefilterDropsWorldTraffic: real UDP from a "world"
// namespace into a node's uplink (a veth with the host device programs
// attached by TCX and the XDP prefilter). From an address in a denied
// CIDR, every datagram is dropped at XDP: the prefilter counts each one,
// the host's ingress program (from_netdev) never runs for them and the
// node's socket receives none; the same sender from an allowed address
// gets through. After the CIDR is deleted from the list, the denied
// address's datagrams reach the socket through from_netdev again.
func TestPrivilegedPrefilterDropsWorldTraffic(t *testing.T) {
	testutil.Privileged(t)
	if _, err := bpffs.EnsureMounted(); err != nil {
		t.Fatal(err)
	}
	stats, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
	if err != nil {
		t.Fatal(err)
	}
	defer stats.Close()

	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	node, err := netns.New()
	if err != nil {
		t.Fatal(err)
	}
	world, err := netns.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := netns.Set(node); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = netns.Set(orig)
		node.Close()
		world.Close()
		orig.Close()
		runtime.UnlockOSThread()
	})
	uplink := netlab.AddVeth(t, "tdrpfup", "tdrpfw")
	up, _ := netlink.LinkByIndex(uplink)
	if err := netlink.AddrAdd(up, &netlink.Addr{IPNet: &net.IPNet{IP: nodeAddr.AsSlice(), Mask: net.CIDRMask(24, 32)}}); err != nil {
		t.Fatal(err)
	}
	peer, err := netlink.LinkByName("tdrpfw")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetNsFd(peer, int(world)); err != nil {
		t.Fatal(err)
	}
	wh, err := netlink.NewHandleAt(world)
	if err != nil {
		t.Fatal(err)
	}
	defer wh.Close()
	weth, err := wh.LinkByName("tdrpfw")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []*netlink.Addr{
		{IPNet: &net.IPNet{IP: worldAddr.AsSlice(), Mask: net.CIDRMask(24, 32)}},
		{IPNet: &net.IPNet{IP: denied.AsSlice(), Mask: net.CIDRMask(32, 32)}},
	} {
		if err := wh.AddrAdd(weth, a); err != nil {
			t.Fatal(err)
		}
	}
	if err := wh.LinkSetUp(weth); err != nil {
		t.Fatal(err)
	}
	// No ARP nor IPv6 chatter on the link: the only packets the host
	// programs could see are the test's.
	if err := wh.NeighAdd(&netlink.Neigh{LinkIndex: weth.Attrs().Index, IP: nodeAddr.AsSlice(), HardwareAddr: up.Attrs().HardwareAddr, State: netlink.NUD_PERMANENT}); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []netns.NsHandle{node, world} {
		if err := netns.Set(ns); err != nil {
			t.Fatal(err)
		}
		_ = os.WriteFile("/proc/sys/net/ipv6/conf/all/disable_ipv6", []byte("1"), 0o644)
	}
	if err := netns.Set(node); err != nil {
		t.Fatal(err)
	}

	b := make([]byte, 4)
	_, _ = rand.Read(b)
	root := filepath.Join("/sys/fs/bpf", "tendril-pftest-"+hex.EncodeToString(b))
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	l := loader.New(loader.Config{BPFRoot: root}, nil)
	t.Cleanup(func() { _ = l.Remove() })
	if err := l.Start(); err != nil {
		t.Fatal(err)
	}
	host, err := hostdev.Load(hostdev.Options{BPFRoot: root, PortMin: 61000, PortMax: 61999, Maps: l.MapReplacements()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(host.Close)
	if err := host.Attach(uplink); err != nil {
		t.Fatal(err)
	}
	fromNetdev := filepath.Join(root, "links", "dev"+strconv.Itoa(uplink)+"-ingress")

	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	dp, err := dpprefilter.Open(root, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dp.Close)
	pf := &Prefilter{dp: dp, log: quiet}
	if err := pf.attach([]string{"tdrpfup"}); err != nil {
		t.Fatal(err)
	}
	list := startList(t, dp, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	rx, err := net.ListenUDP("udp4", &net.UDPAddr{IP: nodeAddr.AsSlice(), Port: 4789})
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	// send sends n datagrams from src (a socket of the world namespace)
	// and returns how many the node's socket got (reading until a marker
	// datagram from the allowed address, sent after them, arrives).
	send := func(src netip.Addr, n int) int {
		t.Helper()
		if err := netns.Set(world); err != nil {
			t.Fatal(err)
		}
		tx, err := net.DialUDP("udp4", &net.UDPAddr{IP: src.AsSlice()}, &net.UDPAddr{IP: nodeAddr.AsSlice(), Port: 4789})
		marker, merr := net.DialUDP("udp4", &net.UDPAddr{IP: worldAddr.AsSlice()}, &net.UDPAddr{IP: nodeAddr.AsSlice(), Port: 4789})
		if serr := netns.Set(node); serr != nil {
			t.Fatal(serr)
		}
		if err != nil || merr != nil {
			t.Fatal(err, merr)
		}
		defer tx.Close()
		defer marker.Close()
		for range n {
			if _, err := tx.Write([]byte("payload")); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := marker.Write([]byte("marker")); err != nil {
			t.Fatal(err)
		}
		got := 0
		buf := make([]byte, 64)
		_ = rx.SetReadDeadline(time.Now().Add(30 * time.Second))
		for {
			m, from, err := rx.ReadFromUDP(buf)
			if err != nil {
				t.Fatalf("no marker datagram: %v", err)
			}
			if string(buf[:m]) == "marker" {
				return got
			}
			if from.AddrPort().Addr().Unmap() == src {
				got++
			}
		}
	}

	const n = 50
	if got := send(denied, n); got != n {
		t.Fatalf("before any deny: %d of %d datagrams arrived", got, n)
	}
	if _, err := list.Patch(ctx, 0, []string{"198.51.100.0/24"}); err != nil {
		t.Fatal(err)
	}
	before, _ := dp.Counters()
	runsBefore := runCount(t, fromNetdev)
	if got := send(denied, n); got != 0 {
		t.Fatalf("denied: %d of %d datagrams arrived", got, n)
	}
	after, _ := dp.Counters()
	runsAfter := runCount(t, fromNetdev)
	if d := after.IPv4Packets - before.IPv4Packets; d != n {
		t.Errorf("prefilter counted %d drops, want %d", d, n)
	}
	// The marker (allowed) passes XDP and runs from_netdev once.
	if d := runsAfter - runsBefore; d != 1 {
		t.Errorf("from_netdev ran %d times for %d denied datagrams and one allowed, want 1", d, n)
	}

	if _, err := list.Delete(ctx, 0, []string{"198.51.100.0/24"}); err != nil {
		t.Fatal(err)
	}
	runsBefore = runCount(t, fromNetdev)
	if got := send(denied, n); got != n {
		t.Fatalf("after delete: %d of %d datagrams arrived", got, n)
	}
	if d := runCount(t, fromNetdev) - runsBefore; d != n+1 {
		t.Errorf("after delete from_netdev ran %d times, want %d", d, n+1)
	}
	if c, _ := dp.Counters(); c.IPv4Packets != after.IPv4Packets {
		t.Errorf("drops counted after delete: %d, was %d", c.IPv4Packets, after.IPv4Packets)
	}
}

// startList runs the deny list over dp, saved in dir, in a hive of its
// own.
func startList(t *testing.T, dp *dpprefilter.Datapath, dir string) *prefilter.List {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var list *prefilter.List
	h := hive.New(cell.Invoke(func(lifecycle.InvokedAll) {}), statedb.Cell, job.Cell,
		cell.Provide(func() cell.Health { hl, _ := cell.NewSimpleHealth(); return hl }),
		cell.Module("prefilter-test", "prefilter under test",
			cell.Invoke(func(db *statedb.DB, jobs job.Registry, hl cell.Health, id cell.FullModuleID) error {
				var err error
				list, err = prefilter.New(prefilter.Params{DB: db, Jobs: jobs.NewGroup(hl), Log: quiet, ModuleID: id, Backend: dp,
					StateFile: filepath.Join(dir, "prefilter.json"), MaxPerFamily: dpprefilter.MaxEntries})
				return err
			})))
	if err := h.Start(quiet, context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Stop(quiet, context.Background()) })
	return list
}
