package nodehealth

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/vishvananda/netlink"

	"github.com/tendril-net/tendril/pkg/agent/agentendpoints"
	"github.com/tendril-net/tendril/pkg/cni"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/endpointmanager"
	"github.com/tendril-net/tendril/pkg/namedns"
)

// HealthContainerID and HealthIfName name the health endpoint's CNI
// attachment (as a runtime names a pod's): the endpoint manager finds it
// again by them after a restart.
const (
	HealthContainerID = "tendril-health"
	HealthIfName      = "eth0"
)

// HealthNetnsPrefix starts the names of health endpoints' network
// namespaces under /run/netns.
const HealthNetnsPrefix = "tendril-health-"

// HealthNetnsName is the name of the health endpoint's network namespace
// under /run/netns: one per agent (the node's name and a hash of its state
// directory: labs on one machine share the directory and node names).
func HealthNetnsName(node, stateDir string) string {
	return namedns.AgentScoped(HealthNetnsPrefix, node, stateDir)
}

// EndpointWiring is what the health endpoint needs of the agent's
// endpoints (pkg/agent/agentendpoints): its CNI ADD in-process and the
// lookup of the endpoint it made.
type EndpointWiring interface {
	// CreateHealthEndpoint wires the namespace at netnsPath as a pod
	// labelled reserved:health, replacing an earlier endpoint of the same
	// attachment (its addresses released).
	CreateHealthEndpoint(ctx context.Context, containerID, ifname, netnsPath string) (*endpoint.Endpoint, error)
	// DeleteHealthEndpoint removes it again (CNI DEL: its addresses
	// released); nothing to remove is no error.
	DeleteHealthEndpoint(ctx context.Context, containerID, ifname, netnsPath string) error
	// LookupEndpoint finds an endpoint by an ID of the Cilium API.
	LookupEndpoint(id string) (*endpoint.Endpoint, error)
}

// RemoveHealthEndpoint removes the health endpoint an earlier run made
// (with --enable-endpoint-health-checking on) and its namespace, now that
// it is off: otherwise its address stays allocated and it stays in the
// endpoint list until removed by hand. Nothing to remove is no error; an
// error while the endpoints are not restored yet (retried).
func RemoveHealthEndpoint(ctx context.Context, wiring EndpointWiring, netnsName string, log *slog.Logger) error {
	id := "cni-attachment-id:" + cni.AttachmentID(HealthContainerID, HealthIfName)
	ep, err := wiring.LookupEndpoint(id)
	switch {
	case errors.Is(err, endpointmanager.ErrNotFound):
	case err != nil:
		return fmt.Errorf("look up the health endpoint: %w", err)
	default:
		if err := wiring.DeleteHealthEndpoint(ctx, HealthContainerID, HealthIfName, ep.NetNS); err != nil {
			return fmt.Errorf("remove the health endpoint %d: %w", ep.ID, err)
		}
		log.Info("Removed the health endpoint an earlier run made (--enable-endpoint-health-checking is off)", "endpoint", ep.ID, "ipv4", ep.IPv4, "ipv6", ep.IPv6)
	}
	if _, err := os.Stat(namedns.Path(netnsName)); err == nil {
		if err := namedns.Delete(netnsName); err != nil {
			return fmt.Errorf("remove the health endpoint's namespace: %w", err)
		}
	}
	return nil
}

// HealthEndpoint is this node's health endpoint, after cilium-health's: a
// network namespace of its own, wired like a pod with an address of this
// node's pod CIDR, with the responder listening inside it (the kernel
// answers ICMP). The namespace is bind-mounted under /run/netns and the
// endpoint kept by the endpoint manager, so both outlive the agent: a
// restarted agent finds them again (restored from disk) and adopts them
// instead of wiring a second one.
type HealthEndpoint struct {
	Node string
	// Netns is the name of the endpoint's namespace (HealthNetnsName).
	Netns  string
	Port   uint16
	Wiring EndpointWiring
	Log    *slog.Logger

	mu      sync.Mutex
	v4, v6  netip.Addr
	changed chan struct{}
}

// NewHealthEndpoint returns the endpoint, not yet made (Run makes it).
func NewHealthEndpoint(node, netnsName string, port uint16, wiring EndpointWiring, log *slog.Logger) *HealthEndpoint {
	return &HealthEndpoint{Node: node, Netns: netnsName, Port: port, Wiring: wiring, Log: log, changed: make(chan struct{})}
}

// NetnsPath is where the endpoint's namespace is mounted.
func (h *HealthEndpoint) NetnsPath() string { return namedns.Path(h.Netns) }

// HealthEndpointAddresses are the endpoint's addresses (invalid until it
// is up) and a channel closed when they change: the TendrilNode
// write-back publishes them.
func (h *HealthEndpoint) HealthEndpointAddresses() (v4, v6 netip.Addr, changed <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.v4, h.v6, h.changed
}

// Addresses are the endpoint's addresses now (none before it is made).
func (h *HealthEndpoint) Addresses() []netip.Addr {
	v4, v6, _ := h.HealthEndpointAddresses()
	var out []netip.Addr
	for _, a := range []netip.Addr{v4, v6} {
		if a.IsValid() {
			out = append(out, a)
		}
	}
	return out
}

func (h *HealthEndpoint) setAddresses(v4, v6 netip.Addr) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.v4 == v4 && h.v6 == v6 {
		return
	}
	h.v4, h.v6 = v4, v6
	close(h.changed)
	h.changed = make(chan struct{})
}

// Ensure makes the endpoint, or adopts the one an earlier run of the agent
// made: the endpoint of the health attachment is kept when its namespace
// is still mounted and still holds the endpoint's addresses on its
// interface. Otherwise the namespace is made anew (a stale mount point
// removed first) and wired again; the ADD replaces a stale endpoint of
// the same attachment and releases its addresses, so none leaks.
func (h *HealthEndpoint) Ensure(ctx context.Context) (ep *endpoint.Endpoint, adopted bool, err error) {
	path := h.NetnsPath()
	id := "cni-attachment-id:" + cni.AttachmentID(HealthContainerID, HealthIfName)
	old, err := h.Wiring.LookupEndpoint(id)
	if err != nil && !errors.Is(err, endpointmanager.ErrNotFound) {
		// Not started yet: an ADD now could replace the endpoint the
		// restore is about to bring back.
		return nil, false, fmt.Errorf("health endpoint: %w", err)
	}
	if err == nil && old.NetNS == path {
		if werr := wired(path, old); werr == nil {
			return old, true, nil
		} else {
			h.Log.Info("The health endpoint's namespace no longer holds it; wiring it again", "endpoint", old.ID, "reason", werr)
		}
	}
	if !isNetns(path) {
		if err := namedns.Delete(h.Netns); err != nil {
			return nil, false, fmt.Errorf("remove stale health namespace: %w", err)
		}
		if err := namedns.Create(h.Netns); err != nil {
			return nil, false, fmt.Errorf("health endpoint: %w", err)
		}
	}
	ep, err = h.Wiring.CreateHealthEndpoint(ctx, HealthContainerID, HealthIfName, path)
	if err != nil {
		return nil, false, err
	}
	return ep, false, nil
}

// wired checks that the namespace at path still has the endpoint's
// interface with its addresses.
func wired(path string, ep *endpoint.Endpoint) error {
	if !isNetns(path) {
		return fmt.Errorf("%s is not a mounted network namespace", path)
	}
	return namedns.InNetns(path, func() error {
		link, err := netlink.LinkByName(HealthIfName)
		if err != nil {
			return fmt.Errorf("interface %s: %w", HealthIfName, err)
		}
		addrs, err := netlink.AddrList(link, netlink.FAMILY_ALL)
		if err != nil {
			return fmt.Errorf("addresses of %s: %w", HealthIfName, err)
		}
		for _, want := range ep.Addresses() {
			found := false
			for _, a := range addrs {
				if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == want {
					found = true
				}
			}
			if !found {
				return fmt.Errorf("%s lacks %s", HealthIfName, want)
			}
		}
		return nil
	})
}

// isNetns reports whether path is a mounted network namespace (nsfs), not
// a file left behind by a namespace that went with a reboot.
func isNetns(path string) bool {
	if _, err := os.Stat(path); err != nil {
		return false
	}
	err := namedns.InNetns(path, func() error { return nil })
	return err == nil
}

// untilStarted runs f until it returns something other than the
// endpoints' ErrNotStarted, looking again every 200 ms without failing
// meanwhile (the restore runs at every start); nil when ctx ends first.
func untilStarted(ctx context.Context, f func() error) error {
	for {
		err := f()
		if !errors.Is(err, agentendpoints.ErrNotStarted) {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Run makes (or adopts) the endpoint, publishes its addresses and serves
// the responder inside its namespace until ctx ends. The endpoint and its
// namespace stay when the agent stops: the next agent adopts them.
func (h *HealthEndpoint) Run(ctx context.Context, health cell.Health) error {
	var ep *endpoint.Endpoint
	var adopted bool
	// On by default, the endpoint must not make every agent's health
	// read degraded while the restore runs.
	err := untilStarted(ctx, func() (err error) {
		ep, adopted, err = h.Ensure(ctx)
		return err
	})
	if err == nil && ep == nil { // stopped while waiting
		return nil
	}
	if err != nil {
		health.Degraded("health endpoint not made", err)
		return err
	}
	if adopted {
		h.Log.Info("Adopted the health endpoint of an earlier run", "endpoint", ep.ID, "ipv4", ep.IPv4, "ipv6", ep.IPv6)
	} else {
		h.Log.Info("Made the health endpoint", "endpoint", ep.ID, "ipv4", ep.IPv4, "ipv6", ep.IPv6, "netns", h.NetnsPath())
	}
	var ln net.Listener
	err = namedns.InNetns(h.NetnsPath(), func() error {
		var lerr error
		ln, lerr = net.Listen("tcp", net.JoinHostPort("", strconv.Itoa(int(h.Port))))
		return lerr
	})
	if err != nil {
		err = fmt.Errorf("health endpoint: listen on port %d: %w", h.Port, err)
		health.Degraded("health endpoint not listening", err)
		return err
	}
	h.setAddresses(ep.IPv4, ep.IPv6)
	resp := &Responder{Node: h.Node, Port: h.Port}
	health.OK(fmt.Sprintf("endpoint %d (%s) serving on port %d", ep.ID, joinAddrs(ep.Addresses()), h.Port))
	err = resp.Serve(ctx, ln)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

func joinAddrs(ips []netip.Addr) string {
	s := ""
	for i, ip := range ips {
		if i > 0 {
			s += ", "
		}
		s += ip.String()
	}
	return s
}
