package nodehealth

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/cni"
	"github.com/tendril-net/tendril/pkg/cni/cniserver"
	"github.com/tendril-net/tendril/pkg/datapath/linux"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/endpointmanager"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/ipam"
	"github.com/tendril-net/tendril/pkg/namedns"
	"github.com/tendril-net/tendril/pkg/nodemanager"
	tutil "github.com/tendril-net/tendril/pkg/testutil"
)

// agentRig is one run of an agent's endpoint wiring inside a node
// namespace: the real IPAM, endpoint manager (its state on disk, restored
// at start) and CNI server, with the host routes of agentendpoints'
// regenerator. Two rigs over the same state directory are an agent and
// the same agent restarted.
type agentRig struct {
	alloc *ipam.IPAM
	mgr   *endpointmanager.Manager
	srv   *cniserver.Server
	nl    *netlink.Handle
	host  *linux.Host
}

var (
	podCIDR  = netip.MustParsePrefix("10.231.0.0/24")
	routerV4 = netip.MustParseAddr("10.231.0.1")
)

func newAgentRig(t *testing.T, nodeNS netns.NsHandle, stateDir string) *agentRig {
	t.Helper()
	log := hivetest.Logger(t)
	r := &agentRig{}
	err := linux.InNetNS(nodeNS, func() error {
		alloc, err := ipam.New(ipam.Config{ExpirationTimeout: time.Minute}, log, podCIDR, netip.Prefix{})
		if err != nil {
			return err
		}
		store, err := endpoint.NewStore(stateDir, log)
		if err != nil {
			return err
		}
		nl, err := netlink.NewHandleAt(nodeNS, unix.NETLINK_ROUTE)
		if err != nil {
			return err
		}
		r.alloc, r.nl = alloc, nl
		r.host = linux.NewHost(nl, nodeNS, log)
		if _, err := r.host.EnsureHostDevice(routerV4.AsSlice(), nil); err != nil {
			return err
		}
		r.mgr = endpointmanager.New(store, alloc, log)
		r.mgr.SetRegenerator(r)
		if _, err := r.mgr.Restore(context.Background(), r.host.LinkExists); err != nil {
			return err
		}
		r.srv, err = cniserver.New(cniserver.Deps{Log: log, IPAM: alloc, Endpoints: rigEndpoints{r}, Netlink: nl, Host: r.host, DeviceMTU: 1500})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.nl.Close() })
	return r
}

// Regenerate routes the endpoint's addresses to its host veth, as
// agentendpoints' regenerator does.
func (r *agentRig) Regenerate(_ context.Context, ep *endpoint.Endpoint) error {
	link, err := r.nl.LinkByName(ep.HostIfName)
	if err != nil {
		return err
	}
	ep.HostIfIndex = link.Attrs().Index
	if err := r.host.ConfigureHostVeth(ep.HostIfName, nil); err != nil {
		return err
	}
	for _, ip := range ep.Addresses() {
		if err := r.host.UpsertEndpointRoute(ip.AsSlice(), ep.HostIfIndex); err != nil {
			return err
		}
	}
	return nil
}

func (r *agentRig) Remove(_ context.Context, ep *endpoint.Endpoint) error {
	for _, ip := range ep.Addresses() {
		_ = r.host.DeleteEndpointRoute(ip.AsSlice(), ep.HostIfIndex)
	}
	return nil
}

// CreateHealthEndpoint is agentendpoints.Module's: the in-process ADD.
func (r *agentRig) CreateHealthEndpoint(ctx context.Context, containerID, ifname, netnsPath string) (*endpoint.Endpoint, error) {
	req := &cni.Request{ContainerID: containerID, IfName: ifname, Netns: netnsPath,
		Config: []byte(`{"cniVersion":"1.0.0","name":"tendril-health","type":"tendril-cni"}`)}
	if _, cerr := r.srv.Serve(ctx, cni.CommandAdd, req); cerr != nil {
		return nil, cerr
	}
	return r.mgr.Lookup("cni-attachment-id:" + cni.AttachmentID(containerID, ifname))
}

// DeleteHealthEndpoint is agentendpoints.Module's: the in-process DEL.
func (r *agentRig) DeleteHealthEndpoint(ctx context.Context, containerID, ifname, netnsPath string) error {
	req := &cni.Request{ContainerID: containerID, IfName: ifname, Netns: netnsPath,
		Config: []byte(`{"cniVersion":"1.0.0","name":"tendril-health","type":"tendril-cni"}`)}
	if _, cerr := r.srv.Serve(ctx, cni.CommandDel, req); cerr != nil {
		return cerr
	}
	return nil
}

func (r *agentRig) LookupEndpoint(id string) (*endpoint.Endpoint, error) { return r.mgr.Lookup(id) }

type rigEndpoints struct{ r *agentRig }

func (e rigEndpoints) Create(ctx context.Context, ep *endpoint.Endpoint) (*endpoint.Endpoint, error) {
	return e.r.mgr.Create(ctx, ep, endpointmanager.CreateOptions{SyncBuild: true})
}
func (e rigEndpoints) Lookup(id string) (*endpoint.Endpoint, error) { return e.r.mgr.Lookup(id) }
func (e rigEndpoints) Delete(ctx context.Context, id uint16) error  { return e.r.mgr.Delete(ctx, id) }
func (e rigEndpoints) List() []*endpoint.Endpoint                   { return e.r.mgr.List() }
func (e rigEndpoints) IsNotFound(err error) bool {
	return errors.Is(err, endpointmanager.ErrNotFound)
}

// TestPrivilegedHealthEndpoint: the health endpoint is made in a network
// namespace of its own, wired like a pod with an address of the node's
// pod CIDR, and answers ICMP echo and GET /hello from the node's
// namespace (the real probes). The agent stopped and started again over
// the same state (the endpoint restored from disk): the same endpoint, the
// same address and namespace are adopted, nothing made twice, one address
// allocated, one host veth, and it answers again. Its namespace gone (a
// reboot): made again, the old address released.
func TestPrivilegedHealthEndpoint(t *testing.T) {
	tutil.Privileged(t)
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	node := "tdr-he-" + hex.EncodeToString(b)
	nodeName := node + "-node"
	if err := namedns.Create(nodeName); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = namedns.Delete(nodeName)
	})
	nodeNS, err := netns.GetFromPath(namedns.Path(nodeName))
	if err != nil {
		t.Fatal(err)
	}
	defer nodeNS.Close()
	stateDir := filepath.Join(t.TempDir(), "endpoints")
	healthNS := HealthNetnsName(node, stateDir)
	t.Cleanup(func() { _ = namedns.Delete(healthNS) })
	const port = 4240

	icmp := func(ctx context.Context, ip netip.Addr) (d time.Duration, err error) {
		err = linux.InNetNS(nodeNS, func() error {
			d, err = Ping(ctx, ip)
			return err
		})
		return d, err
	}
	httpProbe := HTTPProbe(port, func(ctx context.Context, network, addr string) (c net.Conn, err error) {
		err = linux.InNetNS(nodeNS, func() error {
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	})

	// run starts an agent's health endpoint over the state directory and
	// returns it once its address is published, with its stop.
	run := func(t *testing.T) (*agentRig, *HealthEndpoint, func()) {
		t.Helper()
		rig := newAgentRig(t, nodeNS, stateDir)
		he := NewHealthEndpoint(node, healthNS, port, rig, hivetest.Logger(t))
		_, _, changed := he.HealthEndpointAddresses()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- he.Run(ctx, health.NewRegistry().Scope("health-endpoint")) }()
		select {
		case <-changed:
		case err := <-done:
			cancel()
			t.Fatalf("health endpoint: %v", err)
		}
		return rig, he, func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("health endpoint run: %v", err)
			}
		}
	}
	answers := func(t *testing.T, ip netip.Addr) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := icmp(ctx, ip); err != nil {
			t.Fatalf("ICMP to the health endpoint %s: %v", ip, err)
		}
		if _, err := httpProbe(ctx, ip); err != nil {
			t.Fatalf("HTTP to the health endpoint %s: %v", ip, err)
		}
	}
	// allocated is the pod CIDR's addresses in use besides the router's.
	allocated := func(rig *agentRig) []string {
		var out []string
		for _, u := range rig.alloc.Usage() {
			for _, a := range u.Allocations {
				if a.IP != u.Router {
					out = append(out, fmt.Sprintf("%s=%s", a.IP, a.Owner))
				}
			}
		}
		return out
	}

	rig1, he1, stop1 := run(t)
	v4, _, _ := he1.HealthEndpointAddresses()
	if !podCIDR.Contains(v4) || v4 == routerV4 {
		t.Fatalf("health endpoint address %s, want one of %s", v4, podCIDR)
	}
	answers(t, v4)
	// The prober's row of this node: its own endpoint, probed from the
	// node's namespace by the real probes.
	db := statedb.New()
	peers, err := nodemanager.NewTables(db)
	if err != nil {
		t.Fatal(err)
	}
	table, err := NewTable(db)
	if err != nil {
		t.Fatal(err)
	}
	prober := &Prober{DB: db, Table: table, Peers: peers.Nodes, ICMP: icmp, HTTP: httpProbe, Timeout: 5 * time.Second,
		Now: time.Now, Log: hivetest.Logger(t), Self: node, Local: he1.Addresses}
	if err := prober.Round(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st, _, ok := table.Get(db.ReadTxn(), StatusByNode.Query(node)); !ok || len(st.Addresses) != 1 || st.Addresses[0].IP != v4 || !st.Addresses[0].Reachable() {
		t.Fatalf("the prober's row of this node: %+v (%v), want its endpoint %s reachable", st, ok, v4)
	}
	eps := rig1.mgr.List()
	if len(eps) != 1 || eps[0].NetNS != namedns.Path(healthNS) {
		t.Fatalf("endpoints %+v, want the health endpoint in its namespace", eps)
	}
	first := eps[0].ID
	stop1()
	// Stopped: the endpoint and its namespace stay, as a pod's do.
	answersStopped := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := icmp(ctx, v4)
		return err
	}
	if err := answersStopped(); err != nil {
		t.Fatalf("the endpoint's namespace went with the agent: %v", err)
	}

	rig2, he2, stop2 := run(t)
	v4again, _, _ := he2.HealthEndpointAddresses()
	if v4again != v4 {
		t.Fatalf("after a restart the health endpoint has %s, want %s (adopted)", v4again, v4)
	}
	answers(t, v4)
	if eps := rig2.mgr.List(); len(eps) != 1 || eps[0].ID != first {
		t.Fatalf("after a restart: endpoints %+v, want endpoint %d alone", eps, first)
	}
	if a := allocated(rig2); len(a) != 1 {
		t.Fatalf("after a restart: allocations %v, want the health endpoint's one", a)
	}
	veths := 0
	links, err := rig2.nl.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if _, ok := l.(*netlink.Veth); ok && l.Attrs().Name != "tendril_host" && l.Attrs().Name != "tendril_net" {
			veths++
		}
	}
	if veths != 1 {
		t.Fatalf("%d pod veths in the node namespace after a restart, want 1", veths)
	}
	stop2()

	// The namespace gone, as after a reboot (the endpoint's state is on
	// disk, its veth went with the namespace): the next start makes it
	// again and the stale endpoint's address goes back to IPAM.
	if err := namedns.Delete(healthNS); err != nil {
		t.Fatal(err)
	}
	tutil.Eventually(t, 10*time.Second, "the old endpoint's veth gone with its namespace", func() bool {
		ls, err := rig2.nl.LinkList()
		if err != nil {
			return false
		}
		for _, l := range ls {
			if _, ok := l.(*netlink.Veth); ok && l.Attrs().Name != "tendril_host" && l.Attrs().Name != "tendril_net" {
				return false
			}
		}
		return true
	})
	rig3, he3, stop3 := run(t)
	v4new, _, _ := he3.HealthEndpointAddresses()
	answers(t, v4new)
	if eps := rig3.mgr.List(); len(eps) != 1 {
		t.Fatalf("after the namespace was lost: endpoints %+v, want one", eps)
	}
	if a := allocated(rig3); len(a) != 1 {
		t.Fatalf("after the namespace was lost: allocations %v, want the new endpoint's one", a)
	}
	stop3()

	// The flag turned off: the next start removes the endpoint, its
	// address and its namespace; a second removal finds nothing to do.
	rig4 := newAgentRig(t, nodeNS, stateDir)
	for range 2 {
		if err := RemoveHealthEndpoint(context.Background(), rig4, healthNS, hivetest.Logger(t)); err != nil {
			t.Fatal(err)
		}
	}
	if eps := rig4.mgr.List(); len(eps) != 0 {
		t.Fatalf("after the removal: endpoints %+v, want none", eps)
	}
	if a := allocated(rig4); len(a) != 0 {
		t.Fatalf("after the removal: allocations %v, want none", a)
	}
	if _, err := os.Stat(namedns.Path(healthNS)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the health namespace is still there after the removal: %v", err)
	}
}
