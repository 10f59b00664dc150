package e2e_test

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/tendril-net/tendril/pkg/agent/nodehealth"
	"github.com/tendril-net/tendril/pkg/lab"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// healthResponse is `tendril health -o json` on a node's agent, and the
// output it was read from (for messages).
func healthResponse(t *testing.T, node lab.Node) (nodehealth.HealthResponse, string, error) {
	t.Helper()
	out := runTendril(t, "-H", "unix://"+node.Socket, "health", "-o", "json")
	var resp nodehealth.HealthResponse
	if err := json.Unmarshal([]byte(out), &resp); err != nil {
		return resp, out, fmt.Errorf("tendril health -o json on %s: %w\n%s", node.Name, err, out)
	}
	return resp, out, nil
}

// healthView is `tendril health -o json` on a node's agent: whether it
// sees peer reachable (both probes on its primary address) and probed.
func healthView(t *testing.T, node lab.Node, peer string) (reachable, probed bool, err error) {
	t.Helper()
	resp, out, err := healthResponse(t, node)
	if err != nil {
		return false, false, err
	}
	for _, n := range resp.Nodes {
		if n.Name == peer {
			return n.Reachable, n.Probed, nil
		}
	}
	return false, false, fmt.Errorf("%s's health view has no %s: %s", node.Name, peer, out)
}

// healthEndpointView is the result of peer's health endpoint in node's
// `tendril health -o json`; an error while it has none.
func healthEndpointView(t *testing.T, node lab.Node, peer string) (nodehealth.Address, error) {
	t.Helper()
	resp, out, err := healthResponse(t, node)
	if err != nil {
		return nodehealth.Address{}, err
	}
	if a, ok := resp.HealthEndpoint(peer); ok {
		return a, nil
	}
	return nodehealth.Address{}, fmt.Errorf("%s's health view has no health endpoint of %s: %s", node.Name, peer, out)
}

// healthEndpointsReachable waits until each node sees the other's health
// endpoint reachable, both probes answered.
func healthEndpointsReachable(t *testing.T, n1, n2 lab.Node) {
	t.Helper()
	eventually(t, "each node's health endpoint reachable from the other", func() (bool, error) {
		for _, v := range []struct {
			from lab.Node
			peer string
		}{{n1, n2.Name}, {n2, n1.Name}} {
			a, err := healthEndpointView(t, v.from, v.peer)
			if err != nil {
				return false, err
			}
			if !a.Reachable() {
				return false, fmt.Errorf("%s sees %s's health endpoint %s: icmp %v, http %v", v.from.Name, v.peer, a.IP, a.ICMP, a.HTTP)
			}
		}
		return true, nil
	})
}

// healthIPv6Reachable waits until each node sees the other's IPv6
// addresses answer both probes (ICMPv6 echo and HTTP on the health port):
// the node's own IPv6 address and its health endpoint's. The IPv4 rows are
// what the other checks look at; this is the dual-stack lab's.
func healthIPv6Reachable(t *testing.T, n1, n2 lab.Node) {
	t.Helper()
	eventually(t, "each node's IPv6 node and health endpoint addresses reachable from the other", func() (bool, error) {
		for _, v := range []struct {
			from lab.Node
			peer string
		}{{n1, n2.Name}, {n2, n1.Name}} {
			resp, out, err := healthResponse(t, v.from)
			if err != nil {
				return false, err
			}
			var node, endpoint bool
			for _, n := range resp.Nodes {
				if n.Name != v.peer {
					continue
				}
				for _, a := range n.Addresses {
					if !a.IP.Is6() || a.IP.Is4In6() {
						continue
					}
					if !a.Reachable() {
						return false, fmt.Errorf("%s sees %s's %s %s: icmp %v, http %v", v.from.Name, v.peer, a.Kind(), a.IP, a.ICMP, a.HTTP)
					}
					if a.HealthEndpoint {
						endpoint = true
					} else {
						node = true
					}
				}
			}
			if !node || !endpoint {
				return false, fmt.Errorf("%s's view of %s has an IPv6 node address %v, an IPv6 health endpoint %v: %s", v.from.Name, v.peer, node, endpoint, out)
			}
		}
		return true, nil
	})
}

// setBridgePort sets the node's port on the lab bridge (the veth named
// after the node, in the lab's network namespace) up or down: down cuts
// the node off the lab network, as a pulled cable would.
func setBridgePort(e *env, node string, up bool) error {
	ns, err := netns.GetFromPath(lab.NetnsPath(e.st.NetNetns))
	if err != nil {
		return fmt.Errorf("open %s: %w", e.st.NetNetns, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	link, err := h.LinkByName(node)
	if err != nil {
		return fmt.Errorf("bridge port %s: %w", node, err)
	}
	if up {
		return h.LinkSetUp(link)
	}
	return h.LinkSetDown(link)
}

// TestPrivilegedLabNodeHealth: every agent probes the other node (ICMP
// and HTTP on its health port). A node cut off the lab network shows as
// unreachable in the other node's view and the other node in its own,
// and both recover once it is plugged in again. The times are logged
// (the deadline only keeps a broken lab from hanging the test).
func TestPrivilegedLabNodeHealth(t *testing.T) {
	e := labUp(t)
	n1, n2 := e.st.Nodes[0], e.st.Nodes[1]
	both := func(want bool) func() (bool, error) {
		return func() (bool, error) {
			for _, v := range []struct {
				from lab.Node
				peer string
			}{{n1, n2.Name}, {n2, n1.Name}} {
				r, probed, err := healthView(t, v.from, v.peer)
				if err != nil {
					return false, err
				}
				if !probed || r != want {
					return false, fmt.Errorf("%s sees %s reachable=%v (probed %v), want %v", v.from.Name, v.peer, r, probed, want)
				}
			}
			return true, nil
		}
	}
	eventually(t, "both nodes reachable from each other", both(true))

	// Each node's health endpoint (a namespace with an address of its pod
	// CIDR, published in its TendrilNode) is probed by the other node
	// through the datapath, both probes answered.
	healthEndpointsReachable(t, n1, n2)

	// The stock cilium-dbg lists the cluster's nodes from GET
	// /v1/cluster/nodes: this node as itself, the other with its address.
	out, err := exec.Command("../../hack/cilium-dbg.sh").Output()
	testutil.Require(t, err == nil, fmt.Sprintf("stock cilium-dbg not built: %v", err))
	list, err := exec.Command(strings.TrimSpace(string(out)), "-H", "unix://"+n1.Socket, "node", "list").CombinedOutput()
	if err != nil {
		t.Fatalf("cilium-dbg node list: %v\n%s", err, list)
	}
	t.Logf("cilium-dbg node list on %s:\n%s", n1.Name, list)
	if !strings.Contains(string(list), n2.Name) || !strings.Contains(string(list), n2.Address) {
		t.Errorf("cilium-dbg node list on %s lacks %s (%s)", n1.Name, n2.Name, n2.Address)
	}

	if err := setBridgePort(e, n2.Name, false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := setBridgePort(e, n2.Name, true); err != nil {
			t.Errorf("plug %s in again: %v", n2.Name, err)
		}
	})
	cut := time.Now()
	eventually(t, n2.Name+" unreachable from "+n1.Name+" and the other way", both(false))
	t.Logf("unreachable on both sides %v after the cut (probe interval 10s)", time.Since(cut).Round(time.Millisecond))

	if err := setBridgePort(e, n2.Name, true); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	eventually(t, "both nodes reachable again", both(true))
	t.Logf("reachable again on both sides %v after the node was plugged in", time.Since(back).Round(time.Millisecond))
}
