package lab

import (
	"fmt"
	"net"
	"regexp"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/tendril-net/tendril/pkg/namedns"
)

// InNetns runs fn on a thread inside the network namespace at path.
// Sockets fn creates stay in that namespace and may be used from any
// goroutine afterwards.
func InNetns(path string, fn func() error) error { return namedns.InNetns(path, fn) }

// CreateNetns creates a named network namespace (mounted under /run/netns
// as iproute2 mounts them) with its loopback up.
func CreateNetns(name string) error { return namedns.Create(name) }

// DeleteNetns unmounts and removes a named network namespace; a missing one
// is no error. The namespace itself goes once no process holds it.
func DeleteNetns(name string) error { return namedns.Delete(name) }

// ListLabNetns lists the named network namespaces of the lab: exactly the
// names the lab gives (<name>-net, <name>-world, <name>-nodeN, <name>-pod-<12 hex>), so
// that another tool's namespaces that merely share the prefix are never
// touched.
func ListLabNetns(name string) ([]string, error) {
	own := regexp.MustCompile("^" + regexp.QuoteMeta(NetnsPrefix(name)) + `(net|world|node[0-9]+|pod-[0-9a-f]{12})$`)
	all, err := ListNetns(NetnsPrefix(name))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range all {
		if own.MatchString(n) {
			out = append(out, n)
		}
	}
	return out, nil
}

// ListNetns lists the named network namespaces starting with prefix.
func ListNetns(prefix string) ([]string, error) { return namedns.List(prefix) }

func handleAt(name string) (*netlink.Handle, error) {
	ns, err := netns.GetFromName(name)
	if err != nil {
		return nil, fmt.Errorf("open network namespace %s: %w", name, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("netlink in %s: %w", name, err)
	}
	return h, nil
}

// createLabNetwork makes the lab network namespace with its bridge.
func createLabNetwork(netName string) error {
	if err := CreateNetns(netName); err != nil {
		return err
	}
	h, err := handleAt(netName)
	if err != nil {
		return err
	}
	defer h.Close()
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: BridgeName}}
	if err := h.LinkAdd(br); err != nil {
		return fmt.Errorf("create bridge %s in %s: %w (does the kernel have CONFIG_BRIDGE?)", BridgeName, netName, err)
	}
	if err := h.LinkSetUp(br); err != nil {
		return fmt.Errorf("bridge %s up: %w", BridgeName, err)
	}
	return nil
}

// attachNode creates the node's namespace and plugs it into the bridge: a
// veth named after the node on the bridge side, eth0 with the node address
// on the node side.
func attachNode(netName string, n Node) error {
	if err := CreateNetns(n.Netns); err != nil {
		return err
	}
	nodeNs, err := netns.GetFromName(n.Netns)
	if err != nil {
		return fmt.Errorf("open network namespace %s: %w", n.Netns, err)
	}
	defer nodeNs.Close()
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
		LinkAttrs:     netlink.LinkAttrs{Name: n.Name, MasterIndex: br.Attrs().Index},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(int(nodeNs)),
	}
	if err := h.LinkAdd(veth); err != nil {
		return fmt.Errorf("create veth %s <-> %s/eth0: %w (does the kernel have CONFIG_VETH?)", n.Name, n.Netns, err)
	}
	if err := h.LinkSetUp(veth); err != nil {
		return fmt.Errorf("veth %s up: %w", n.Name, err)
	}
	nh, err := netlink.NewHandleAt(nodeNs)
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", n.Netns, err)
	}
	defer nh.Close()
	eth0, err := nh.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("%s: eth0: %w", n.Netns, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(n.Address), Mask: net.CIDRMask(NodeSubnetBits, 32)}}
	if err := nh.AddrAdd(eth0, addr); err != nil {
		return fmt.Errorf("%s: address %s on eth0: %w", n.Netns, n.Address, err)
	}
	if err := nh.LinkSetUp(eth0); err != nil {
		return fmt.Errorf("%s: eth0 up: %w", n.Netns, err)
	}
	return nil
}
