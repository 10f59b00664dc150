// Package netlab builds network namespaces wired as a Tendril node and its
// pods, for the datapath's real-traffic tests and benchmarks: the router
// addresses on the node's host device, a /32 and /128 route per pod to its
// host-side veth (pkg/datapath/linux, as the agent sets them up), and in
// each pod its addresses, a permanent neighbor entry for the router and a
// default route through it (as tendril-cni configures pods). Namespaces are
// named (/run/netns/...), so tools reach them with nsenter; ip netns exec is
// avoided because it hides bpffs.
package netlab

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/datapath/linux"
)

// Router addresses of the node: the pods' gateway.
var (
	Router4 = netip.MustParseAddr("10.77.0.1")
	Router6 = netip.MustParseAddr("fd00:77::1")
)

// Node is the node's namespace and its pods.
type Node struct {
	Name   string
	NS     netns.NsHandle
	Handle *netlink.Handle
	Host   *linux.Host
	Pods   []*Pod
	// namespaces are every named namespace created, removed by Close.
	namespaces []string
}

// Pod is one pod: its namespace, addresses and veth pair.
type Pod struct {
	Name      string
	NetnsPath string
	NS        netns.NsHandle
	IPv4      netip.Addr
	IPv6      netip.Addr
	// HostIf is the host-side veth in the node's namespace.
	HostIf      string
	HostIfIndex int
	// MAC is the pod's eth0; HostMAC the host-side veth's.
	MAC     net.HardwareAddr
	HostMAC net.HardwareAddr
}

func randomSuffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func addNetns(name string) (netns.NsHandle, error) {
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return netns.None(), fmt.Errorf("ip netns add %s: %w: %s", name, err, out)
	}
	ns, err := netns.GetFromName(name)
	if err != nil {
		_ = exec.Command("ip", "netns", "del", name).Run()
		return netns.None(), fmt.Errorf("open netns %s: %w", name, err)
	}
	return ns, nil
}

// NewNode creates the node's namespace (named prefix-node-<random>) with
// its host device and forwarding on.
func NewNode(prefix string) (*Node, error) {
	n := &Node{Name: prefix + "-node-" + randomSuffix()}
	ns, err := addNetns(n.Name)
	if err != nil {
		return nil, err
	}
	n.NS = ns
	n.namespaces = append(n.namespaces, n.Name)
	if n.Handle, err = netlink.NewHandleAt(ns); err != nil {
		_ = n.Close()
		return nil, fmt.Errorf("netlink handle in %s: %w", n.Name, err)
	}
	n.Host = linux.NewHost(n.Handle, ns, nil)
	if _, err := n.Host.EnsureHostDevice(Router4.AsSlice(), Router6.AsSlice()); err != nil {
		_ = n.Close()
		return nil, err
	}
	return n, nil
}

// Enter locks the calling goroutine to its thread and moves the thread
// into the node's namespace (TCX attach and BPF_PROG_TEST_RUN resolve
// interface indexes there); leave undoes it.
func (n *Node) Enter() (leave func(), err error) {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("current netns: %w", err)
	}
	if err := netns.Set(n.NS); err != nil {
		orig.Close()
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("enter %s: %w", n.Name, err)
	}
	return func() {
		if err := netns.Set(orig); err == nil {
			// A thread that could not go back stays locked and dies
			// with its goroutine.
			runtime.UnlockOSThread()
		}
		orig.Close()
	}, nil
}

// AddPod creates pod number i: addresses 10.77.0.(10+i) and
// fd00:77::(10+i in hex), host-side veth lxc<name>, eth0 inside.
func (n *Node) AddPod(name string, i int) (*Pod, error) {
	if i < 0 || i > 200 {
		return nil, fmt.Errorf("pod index %d out of range", i)
	}
	p := &Pod{Name: name, HostIf: "lxc" + name,
		IPv4: netip.AddrFrom4([4]byte{10, 77, 0, byte(10 + i)}), IPv6: netip.MustParseAddr(fmt.Sprintf("fd00:77::%x", 0x10+i))}
	nsName := n.Name + "-" + name
	ns, err := addNetns(nsName)
	if err != nil {
		return nil, err
	}
	n.namespaces = append(n.namespaces, nsName)
	p.NS, p.NetnsPath = ns, "/run/netns/"+nsName
	if err := n.wireHost(p); err != nil {
		ns.Close()
		return nil, fmt.Errorf("pod %s, node side: %w", name, err)
	}
	if err := wirePod(p); err != nil {
		ns.Close()
		return nil, fmt.Errorf("pod %s, pod side: %w", name, err)
	}
	n.Pods = append(n.Pods, p)
	return p, nil
}

func (n *Node) wireHost(p *Pod) error {
	la := netlink.NewLinkAttrs()
	la.Name = p.HostIf
	if err := n.Handle.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(p.NS))}); err != nil {
		return fmt.Errorf("add veth %s: %w", p.HostIf, err)
	}
	host, err := n.Handle.LinkByName(p.HostIf)
	if err != nil {
		return fmt.Errorf("look up %s: %w", p.HostIf, err)
	}
	p.HostIfIndex, p.HostMAC = host.Attrs().Index, host.Attrs().HardwareAddr
	if err := n.Handle.LinkSetUp(host); err != nil {
		return fmt.Errorf("set %s up: %w", p.HostIf, err)
	}
	if err := n.Host.ConfigureHostVeth(p.HostIf, Router6.AsSlice()); err != nil {
		return err
	}
	for _, ip := range []netip.Addr{p.IPv4, p.IPv6} {
		if err := n.Host.UpsertEndpointRoute(ip.AsSlice(), p.HostIfIndex); err != nil {
			return err
		}
	}
	return nil
}

func wirePod(p *Pod) error {
	ph, err := netlink.NewHandleAt(p.NS)
	if err != nil {
		return fmt.Errorf("netlink handle: %w", err)
	}
	defer ph.Close()
	lo, err := ph.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("look up lo: %w", err)
	}
	eth, err := ph.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("look up eth0: %w", err)
	}
	p.MAC = eth.Attrs().HardwareAddr
	for _, l := range []netlink.Link{lo, eth} {
		if err := ph.LinkSetUp(l); err != nil {
			return fmt.Errorf("set %s up: %w", l.Attrs().Name, err)
		}
	}
	for _, f := range []struct {
		ip, router netip.Addr
		family     int
		zero       net.IP
	}{{p.IPv4, Router4, unix.AF_INET, net.IPv4zero.To4()}, {p.IPv6, Router6, unix.AF_INET6, net.IPv6zero}} {
		bits := f.ip.BitLen()
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: f.ip.AsSlice(), Mask: net.CIDRMask(bits, bits)}, Flags: unix.IFA_F_NODAD}
		if err := ph.AddrAdd(eth, addr); err != nil {
			return fmt.Errorf("add %s: %w", addr.IPNet, err)
		}
		neigh := &netlink.Neigh{LinkIndex: eth.Attrs().Index, Family: f.family, State: netlink.NUD_PERMANENT, IP: f.router.AsSlice(), HardwareAddr: p.HostMAC}
		if err := ph.NeighSet(neigh); err != nil {
			return fmt.Errorf("neighbor %s: %w", f.router, err)
		}
		for _, r := range []*netlink.Route{
			{LinkIndex: eth.Attrs().Index, Dst: &net.IPNet{IP: f.router.AsSlice(), Mask: net.CIDRMask(bits, bits)}, Scope: netlink.SCOPE_LINK},
			{LinkIndex: eth.Attrs().Index, Dst: &net.IPNet{IP: f.zero, Mask: net.CIDRMask(0, bits)}, Gw: f.router.AsSlice()},
		} {
			if err := ph.RouteReplace(r); err != nil {
				return fmt.Errorf("route %s: %w", r.Dst, err)
			}
		}
	}
	return nil
}

// Command runs a program inside the pod's namespace (through nsenter).
func (p *Pod) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("nsenter", append([]string{"--net=" + p.NetnsPath, name}, args...)...)
}

// Do runs fn on a thread in the pod's namespace: sockets fn creates
// belong to the pod.
func (p *Pod) Do(fn func() error) error { return linux.InNetNS(p.NS, fn) }

// HostTxPackets is how many packets the node sent into p through its
// host-side veth: what the host stack delivered, not what the datapath
// redirected into the pod directly.
func (n *Node) HostTxPackets(p *Pod) (uint64, error) {
	l, err := n.Handle.LinkByIndex(p.HostIfIndex)
	if err != nil {
		return 0, fmt.Errorf("look up %s: %w", p.HostIf, err)
	}
	return l.Attrs().Statistics.TxPackets, nil
}

// Close removes every namespace (and with them the veths).
func (n *Node) Close() error {
	var errs []error
	for _, p := range n.Pods {
		p.NS.Close()
	}
	if n.Handle != nil {
		n.Handle.Close()
	}
	n.NS.Close()
	for i := len(n.namespaces) - 1; i >= 0; i-- {
		if out, err := exec.Command("ip", "netns", "del", n.namespaces[i]).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ip netns del %s: %w: %s", n.namespaces[i], err, out))
		}
	}
	return errors.Join(errs...)
}

// AddVeth creates a veth pair in the calling thread's namespace, sets the
// first side up and returns its ifindex (for programs run with
// BPF_PROG_TEST_RUN on a context with that ifindex).
func AddVeth(t testing.TB, name, peer string) int {
	t.Helper()
	la := netlink.NewLinkAttrs()
	la.Name = name
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: peer}); err != nil {
		t.Fatal(err)
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		t.Fatal(err)
	}
	return l.Attrs().Index
}

// EnterNode creates a node (NewNode) whose namespace the calling
// goroutine's thread enters until the test ends, and names a bpffs
// directory for the test's pins, /sys/fs/bpf/tendril-<pinName>-<random>,
// removed when the test ends (pinned links and maps outlive the
// namespaces otherwise).
func EnterNode(t testing.TB, prefix, pinName string) (node *Node, pinRoot string) {
	t.Helper()
	node, err := NewNode(prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Close() })
	leave, err := node.Enter()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(leave)
	pinRoot = filepath.Join("/sys/fs/bpf", "tendril-"+pinName+"-"+randomSuffix())
	t.Cleanup(func() { _ = os.RemoveAll(pinRoot) })
	return node, pinRoot
}
