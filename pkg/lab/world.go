package lab

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/tendril-net/tendril/pkg/lab/workload"
)

// The world: a network namespace beyond the lab bridge that stands for
// everything outside the cluster. It holds the nodes' default gateway on
// the bridge (WorldGateway) and, behind it, addresses of a documentation
// range (RFC 5737) for a server and a client. Like a real outside network
// it has no route to the pod CIDRs: a pod reaches it only with its
// traffic masqueraded to its node's address, and a reply to a pod address
// would have nowhere to go.
const (
	// WorldRef names the world where a command takes NS/POD (lab exec,
	// lab probe).
	WorldRef = "world"
	// WorldGateway is the world's address on the lab bridge: every node's
	// default route points at it.
	WorldGateway = NodeSubnetPrefix + "1"
	// WorldServerIP serves TCP and UDP on WorldServerPorts and answers with
	// the source address and port it sees ("world from 172.30.0.11:61001").
	WorldServerIP = "198.51.100.1"
	// WorldClientIP is the source of connections made from the world (lab
	// probe world ...).
	WorldClientIP = "198.51.100.2"
	// WorldDevice holds the world's own addresses (/32 each): its
	// loopback, so that nothing but the lab kernel's own features is
	// needed (the machine's kernel may lack the dummy device).
	WorldDevice = "lo"
	// worldServerName is the world server's answer's first word.
	worldServerName = "world"
)

// WorldServerPorts are the world server's TCP and UDP ports.
var WorldServerPorts = []int{80, 81}

// World is the lab's outside network as lab.json records it.
type World struct {
	Netns    string `json:"netns"`
	Gateway  string `json:"gateway"`
	ServerIP string `json:"serverIP"`
	ClientIP string `json:"clientIP"`
	// ServerIP6 and ClientIP6 are the server's and the client's IPv6
	// addresses in a dual-stack lab (empty otherwise).
	ServerIP6 string `json:"serverIP6,omitempty"`
	ClientIP6 string `json:"clientIP6,omitempty"`
}

// WorldNetns names the lab's world namespace.
func WorldNetns(labName string) string { return NetnsPrefix(labName) + "world" }

// newWorld is the world of the named lab.
func newWorld(labName string) *World {
	return &World{Netns: WorldNetns(labName), Gateway: WorldGateway, ServerIP: WorldServerIP, ClientIP: WorldClientIP}
}

// createWorld makes the world namespace and plugs it into the lab bridge:
// a veth "world" on the bridge side, eth0 with the gateway address in the
// world, and the world's own addresses on its loopback.
func createWorld(netName string, w *World) error {
	if err := CreateNetns(w.Netns); err != nil {
		return err
	}
	wns, err := netns.GetFromName(w.Netns)
	if err != nil {
		return fmt.Errorf("open network namespace %s: %w", w.Netns, err)
	}
	defer wns.Close()
	h, err := handleAt(netName)
	if err != nil {
		return err
	}
	defer h.Close()
	br, err := h.LinkByName(BridgeName)
	if err != nil {
		return fmt.Errorf("bridge %s: %w", BridgeName, err)
	}
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: WorldRef, MasterIndex: br.Attrs().Index},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(int(wns)),
	}
	if err := h.LinkAdd(veth); err != nil {
		return fmt.Errorf("create veth %s <-> %s/eth0: %w", WorldRef, w.Netns, err)
	}
	if err := h.LinkSetUp(veth); err != nil {
		return fmt.Errorf("veth %s up: %w", WorldRef, err)
	}
	wh, err := netlink.NewHandleAt(wns)
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", w.Netns, err)
	}
	defer wh.Close()
	eth0, err := wh.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("%s: eth0: %w", w.Netns, err)
	}
	gw := &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(w.Gateway), Mask: net.CIDRMask(NodeSubnetBits, 32)}}
	if err := wh.AddrAdd(eth0, gw); err != nil {
		return fmt.Errorf("%s: address %s on eth0: %w", w.Netns, w.Gateway, err)
	}
	if err := wh.LinkSetUp(eth0); err != nil {
		return fmt.Errorf("%s: eth0 up: %w", w.Netns, err)
	}
	out, err := wh.LinkByName(WorldDevice)
	if err != nil {
		return fmt.Errorf("%s: %s: %w", w.Netns, WorldDevice, err)
	}
	for _, ip := range []string{w.ServerIP, w.ClientIP} {
		a := &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(ip), Mask: net.CIDRMask(32, 32)}}
		if err := wh.AddrAdd(out, a); err != nil {
			return fmt.Errorf("%s: address %s on %s: %w", w.Netns, ip, WorldDevice, err)
		}
	}
	if err := wh.LinkSetUp(out); err != nil {
		return fmt.Errorf("%s: %s up: %w", w.Netns, WorldDevice, err)
	}
	return nil
}

// addNodeDefaultRoute points a node's default route at the world's
// gateway on the bridge: what is not a pod or a node is the world.
func addNodeDefaultRoute(n Node) error {
	h, err := handleAt(n.Netns)
	if err != nil {
		return err
	}
	defer h.Close()
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("%s: eth0: %w", n.Netns, err)
	}
	r := &netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: net.ParseIP(n.gateway())}
	if err := h.RouteReplace(r); err != nil {
		return fmt.Errorf("%s: default route via %s: %w", n.Netns, n.gateway(), err)
	}
	return nil
}

// routeNodeSubnets makes the world the routed topology's router: its
// address in each node's subnet on its eth0 and IP forwarding on, with
// ICMP redirects off (the subnets share the bridge, so the router would
// otherwise tell a node to send to another node's address on-link,
// which real routers between subnets never do). The world has no route
// to the pod CIDRs: what a node sends there to another node's pod is
// answered with ICMP unreachable or dropped.
func routeNodeSubnets(w *World, nodes []Node) error {
	h, err := handleAt(w.Netns)
	if err != nil {
		return err
	}
	defer h.Close()
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("%s: eth0: %w", w.Netns, err)
	}
	for _, n := range nodes {
		gw := &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(n.gateway()), Mask: net.CIDRMask(NodeSubnetBits, 32)}}
		if err := h.AddrAdd(eth0, gw); err != nil {
			return fmt.Errorf("%s: address %s on eth0: %w", w.Netns, n.gateway(), err)
		}
	}
	return InNetns(NetnsPath(w.Netns), func() error {
		for _, s := range []struct{ path, value string }{
			{"/proc/sys/net/ipv4/ip_forward", "1"},
			{"/proc/sys/net/ipv4/conf/all/send_redirects", "0"},
			{"/proc/sys/net/ipv4/conf/eth0/send_redirects", "0"},
		} {
			if err := os.WriteFile(s.path, []byte(s.value), 0o644); err != nil {
				return fmt.Errorf("%s: %s: %w", w.Netns, s.path, err)
			}
		}
		return nil
	})
}

// WorkloadBinary is a lab pod's server (cmd/tendril-workload), beside
// tendril in the bin dir: the lab's kubelet starts one per pod and the
// world runs it as its server.
const WorkloadBinary = "tendril-workload"

// worldServerArgv runs the lab workload as the world's server at address,
// in the world namespace, answering with the peer it sees.
func worldServerArgv(st *State, address string) []string {
	ports := workload.FormatPorts(WorldServerPorts)
	return []string{"nsenter", "--net=" + NetnsPath(st.World.Netns), filepath.Join(st.BinDir, WorkloadBinary),
		"--pod-name", worldServerName, "--tcp", ports, "--udp", ports, "--report-peer", "--address", address}
}

// startWorldServer starts the world's server (one per address: its IPv4
// one and, in a dual-stack lab, its IPv6 one) and waits until each
// answers from inside the world.
func startWorldServer(ctx context.Context, st *State, exited map[string]<-chan error) error {
	servers := []struct{ role, address string }{{"world-server", st.World.ServerIP}}
	if st.World.ServerIP6 != "" {
		servers = append(servers, struct{ role, address string }{"world-server6", st.World.ServerIP6})
	}
	for _, s := range servers {
		cmd, _, err := StartDetached(st.PidDir(), s.role, filepath.Join(st.LogDir(), s.role+".log"), worldServerArgv(st, s.address))
		if err != nil {
			return err
		}
		exited[s.role] = watchExit(cmd)
		target := net.JoinHostPort(s.address, fmt.Sprint(WorldServerPorts[0]))
		err = poll(ctx, "the world server at "+target, 20*time.Second, st, exited, func() (bool, error) {
			var answered bool
			err := InNetns(NetnsPath(st.World.Netns), func() error {
				_, perr := workload.Probe(ctx, target, false, time.Second)
				answered = perr == nil
				return nil
			})
			return answered, err
		})
		if err != nil {
			return err
		}
	}
	return nil
}
