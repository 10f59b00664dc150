package cni_test

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/tendril-net/tendril/pkg/cni"
	"github.com/tendril-net/tendril/pkg/cni/cniserver"
	"github.com/tendril-net/tendril/pkg/cni/delqueue"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// TestPrivilegedTendrilCNILifecycle drives ADD, CHECK, STATUS, GC and DEL of
// two pods on one node and checks that the pods reach each other by IP.
func TestPrivilegedTendrilCNILifecycle(t *testing.T) {
	testutil.Privileged(t)
	// No grace period: GC below collects pod-a right after its ADD (the
	// grace period itself is TestPrivilegedTendrilCNIGCSafety's).
	n := startNode(t, "--cni-gc-grace-period=0s")
	list := n.confList("tendril-cni", "1.1.0", nil)

	ctx := context.Background()
	if err := n.cni.GetStatusNetworkList(ctx, list); err != nil {
		t.Fatalf("STATUS: %v", err)
	}

	a, b := n.newPod("pod-a"), n.newPod("pod-b")
	// A host veth left by an earlier ADD of pod-a that never saw a DEL
	// (the runtime retries ADD): it must be replaced, not fail the ADD.
	leftover := cniserver.HostVethName(a.rt.ContainerID, "eth0")
	if out, err := inNetns(n.netns, "ip", "link", "add", leftover, "type", "veth", "peer", "name", "tdrcni-stale"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	resA, resB := n.mustAdd(list, a), n.mustAdd(list, b)
	if _, err := n.nl.LinkByName("tdrcni-stale"); err == nil {
		t.Error("the leftover veth pair was not replaced")
	}
	t.Logf("ADD pod-a: %s; pod-b: %s", resA, resB)
	if len(resA.IPs) == 0 || len(resB.IPs) == 0 {
		t.Fatalf("results without addresses: %v / %v", resA, resB)
	}
	// The result names the host veth and the pod interface, and every
	// address points at the pod interface.
	for _, r := range []struct {
		p   *pod
		res *resultView
	}{{a, view(resA)}, {b, view(resB)}} {
		if r.res.hostIf != cniserver.HostVethName(r.p.rt.ContainerID, "eth0") || r.res.podIf != "eth0" || r.res.sandbox != r.p.netns {
			t.Errorf("%s: interfaces %+v", r.p.name, r.res)
		}
		if !r.res.ipsOnPodIf {
			t.Errorf("%s: an address does not point at the pod interface", r.p.name)
		}
	}
	ipA, ipB := resA.IPs[0].Address.IP.String(), resB.IPs[0].Address.IP.String()
	if ipA == ipB {
		t.Fatalf("both pods got %s", ipA)
	}

	// Inside the pod: the address as /32, a default route via the router.
	out, err := inNetns(a.netns, "ip", "-o", "addr", "show", "dev", "eth0")
	if err != nil || !strings.Contains(string(out), ipA+"/32") {
		t.Errorf("pod-a eth0 addresses: %s (%v), want %s/32", out, err, ipA)
	}
	out, err = inNetns(a.netns, "ip", "route", "show", "default")
	if err != nil || !strings.Contains(string(out), "via "+resA.IPs[0].Gateway.String()) {
		t.Errorf("pod-a default route: %s (%v), want via %s", out, err, resA.IPs[0].Gateway)
	}
	// On the node: the pod's /32 routed to its host veth.
	hostA, err := n.nl.LinkByName(cniserver.HostVethName(a.rt.ContainerID, "eth0"))
	if err != nil {
		t.Fatal(err)
	}
	routes, err := n.nl.RouteGet(net.ParseIP(ipA))
	if err != nil || len(routes) == 0 || routes[0].LinkIndex != hostA.Attrs().Index {
		t.Errorf("node route to %s: %+v (%v), want via %s", ipA, routes, err, hostA.Attrs().Name)
	}

	if len(n.endpoints()) < 2 {
		t.Errorf("agent has %d endpoints, want the two pods", len(n.endpoints()))
	}
	if alloc := n.podAllocations(); alloc[ipA] == "" || alloc[ipB] == "" {
		t.Errorf("allocations %v do not hold %s and %s", alloc, ipA, ipB)
	}

	if err := ping(a, ipB); err != nil {
		t.Error(err)
	}
	if err := ping(b, ipA); err != nil {
		t.Error(err)
	}
	for _, ip := range resB.IPs[1:] { // IPv6, when the agent hands it out
		if err := ping(a, ip.Address.IP.String()); err != nil {
			t.Error(err)
		}
	}

	for _, p := range []*pod{a, b} {
		if err := n.check(list, p); err != nil {
			t.Errorf("CHECK %s: %v", p.name, err)
		}
	}
	// CHECK must notice a broken attachment: remove pod-a's address.
	if out, err := inNetns(a.netns, "ip", "addr", "del", ipA+"/32", "dev", "eth0"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if err := n.check(list, a); err == nil {
		t.Error("CHECK passed with the pod's address removed")
	} else if code := cniCode(t, err); code != cni.ErrCheck {
		t.Errorf("CHECK of broken pod: code %d (%v), want %d", code, err, cni.ErrCheck)
	}

	// GC with only pod-b valid removes pod-a's endpoint and veth. A fresh
	// cache dir makes libcni send GC without DELs of its own, so this is
	// the plugin's GC at work.
	gcRuntime := n.runtime(t.TempDir())
	if err := gcRuntime.GCNetworkList(ctx, list, &libcni.GCArgs{ValidAttachments: []types.GCAttachment{{ContainerID: b.rt.ContainerID, IfName: "eth0"}}}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if v := n.hostVeths(); len(v) != 1 || v[0] != cniserver.HostVethName(b.rt.ContainerID, "eth0") {
		t.Errorf("veths after GC: %v, want only pod-b's", v)
	}
	for _, ep := range n.endpoints() {
		if ids := ep.Status.ExternalIdentifiers; ids != nil && ids.ContainerID == a.rt.ContainerID {
			t.Errorf("GC kept pod-a's endpoint %d", ep.ID)
		}
	}
	if _, ok := n.podAllocations()[ipA]; ok {
		t.Errorf("GC left pod-a's address %s allocated", ipA)
	}

	// DEL is idempotent: pod-a is already gone (GC); DEL twice for pod-b,
	// the second time with its netns removed too.
	if err := n.del(list, a); err != nil {
		t.Errorf("DEL of a collected pod: %v", err)
	}
	if err := n.del(list, b); err != nil {
		t.Errorf("DEL pod-b: %v", err)
	}
	if err := n.del(list, b); err != nil {
		t.Errorf("second DEL pod-b: %v", err)
	}
	b.rt.NetNS = "/run/netns/tdrcni-gone-" + randSuffix()
	if err := n.del(list, b); err != nil {
		t.Errorf("DEL with a missing netns: %v", err)
	}
	n.assertClean("DEL")
}

// resultView is what the tests read from an ADD result.
type resultView struct {
	hostIf, podIf, sandbox string
	ipsOnPodIf             bool
}

func view(res *current.Result) *resultView {
	v := &resultView{ipsOnPodIf: true}
	if len(res.Interfaces) >= 2 {
		v.hostIf, v.podIf, v.sandbox = res.Interfaces[0].Name, res.Interfaces[1].Name, res.Interfaces[1].Sandbox
	}
	for _, ip := range res.IPs {
		if ip.Interface == nil || *ip.Interface != 1 {
			v.ipsOnPodIf = false
		}
	}
	return v
}

// TestPrivilegedTendrilCNIBadInput: each bad request gets a clear error
// with the spec's code and leaves no veth, endpoint or allocation.
func TestPrivilegedTendrilCNIBadInput(t *testing.T) {
	testutil.Privileged(t)
	n := startNode(t)
	good := n.confList("tendril-cni", "1.1.0", nil)

	t.Run("malformed config", func(t *testing.T) {
		p := n.newPod("bad-config")
		_, err := n.add(n.confList("tendril-cni", "1.1.0", map[string]any{"mtu": "large"}), p)
		if err == nil {
			t.Fatal("ADD accepted a malformed config")
		}
		if code := cniCode(t, err); code != types.ErrDecodingFailure {
			t.Errorf("code %d (%v), want %d", code, err, types.ErrDecodingFailure)
		}
		_, err = n.add(n.confList("tendril-cni", "1.1.0", map[string]any{"mtu": 100}), p)
		if err == nil || cniCode(t, err) != types.ErrInvalidNetworkConfig {
			t.Errorf("mtu 100: %v, want code %d", err, types.ErrInvalidNetworkConfig)
		}
		n.assertClean("malformed config")
	})
	t.Run("unknown CNI version", func(t *testing.T) {
		p := n.newPod("bad-version")
		_, err := n.add(n.confList("tendril-cni", "9.9.9", nil), p)
		if err == nil {
			t.Fatal("ADD accepted cniVersion 9.9.9")
		}
		if code := cniCode(t, err); code != types.ErrIncompatibleCNIVersion {
			t.Errorf("code %d (%v), want %d", code, err, types.ErrIncompatibleCNIVersion)
		}
		n.assertClean("unknown version")
	})
	t.Run("missing netns", func(t *testing.T) {
		p := n.newPod("no-netns")
		p.rt.NetNS = "/run/netns/tdrcni-missing-" + randSuffix()
		_, err := n.add(good, p)
		if err == nil {
			t.Fatal("ADD succeeded without a netns")
		}
		if code := cniCode(t, err); code != types.ErrInvalidEnvironmentVariables || !strings.Contains(err.Error(), "CNI_NETNS") {
			t.Errorf("code %d (%v), want %d naming CNI_NETNS", code, err, types.ErrInvalidEnvironmentVariables)
		}
		n.assertClean("missing netns")
	})
	t.Run("interface exists in pod", func(t *testing.T) {
		p := n.newPod("ifname-taken")
		if out, err := inNetns(p.netns, "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "other"); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		_, err := n.add(good, p)
		if err == nil {
			t.Fatal("ADD succeeded although eth0 exists in the pod")
		}
		if code := cniCode(t, err); code != cni.ErrLink {
			t.Errorf("code %d (%v), want %d", code, err, cni.ErrLink)
		}
		n.assertClean("taken ifname")
	})
	t.Run("agent down", func(t *testing.T) {
		p := n.newPod("no-agent")
		// A socket in a directory of its own: its DEL queue is not the
		// running agent's.
		none := filepath.Join(t.TempDir(), "none.sock")
		list := n.confList("tendril-cni", "1.1.0", map[string]any{"agent-socket": none})
		_, err := n.add(list, p)
		if err == nil {
			t.Fatal("ADD succeeded without an agent")
		}
		if code := cniCode(t, err); code != types.ErrTryAgainLater {
			t.Errorf("code %d (%v), want %d", code, err, types.ErrTryAgainLater)
		}
		if err := n.cni.GetStatusNetworkList(context.Background(), list); err == nil || cniCode(t, err) != cni.ErrPluginNotAvailable {
			t.Errorf("STATUS without agent: %v, want code %d", err, cni.ErrPluginNotAvailable)
		}
		n.assertClean("agent down")

		// DEL while no agent listens: it succeeds (a "try again" would
		// hold the pod in Terminating for as long as no agent runs:
		// forever after an uninstall) and is queued beside the socket it
		// found no agent on. The agent does the work, so the attachment
		// is still whole (veth, endpoint) until one runs the queue; here
		// the DEL through the agent does it.
		up := n.newPod("del-queued")
		n.mustAdd(good, up)
		if err := n.del(list, up); err != nil {
			t.Errorf("DEL without agent: %v, want success", err)
		}
		if entries, errs := delqueue.List(delqueue.Dir(none)); len(entries) != 1 || len(errs) != 0 {
			t.Errorf("DEL without agent: queue %v %v, want the DEL", entries, errs)
		}
		if v := n.hostVeths(); len(v) != 1 {
			t.Errorf("DEL without agent: veths %v, want the pod's still there", v)
		}
		if err := n.del(good, up); err != nil {
			t.Errorf("DEL through the agent: %v", err)
		}
		n.assertClean("DEL through the agent")
	})
	t.Run("DEL while the agent restarts", func(t *testing.T) {
		// The agent is killed (its socket file stays: nobody accepts),
		// the pod is deleted meanwhile: the DEL is queued and succeeds,
		// and the restarted agent runs it at start: veth, endpoint and
		// addresses go.
		p := n.newPod("del-restart")
		n.mustAdd(good, p)
		n.killAgent(t)
		if err := n.del(good, p); err != nil {
			t.Fatalf("DEL with the agent down: %v, want success", err)
		}
		if entries, _ := delqueue.List(delqueue.Dir(n.socket)); len(entries) != 1 {
			t.Fatalf("queue %v, want the DEL", entries)
		}
		n.runAgent(t)
		eventually(t, "the queued DEL run by the restarted agent", func() bool {
			entries, _ := delqueue.List(delqueue.Dir(n.socket))
			return len(entries) == 0 && len(n.hostVeths()) == 0 && len(n.endpoints()) == 0
		})
		n.assertClean("queued DEL after the restart")
	})
}

// TestPrivilegedTendrilCNIExhaustedPool fills a tiny pool: the ADD that
// finds it empty fails with a clear error and leaves nothing behind, and
// once a pod is deleted its address can be handed out again.
func TestPrivilegedTendrilCNIExhaustedPool(t *testing.T) {
	testutil.Privileged(t)
	n := startNode(t, "--ipv4-range", "10.203.0.0/29", "--ipv6-range", "none")
	list := n.confList("tendril-cni", "1.1.0", nil)
	var pods []*pod
	var lastErr error
	for i := range 16 { // far more than a /29 holds
		p := n.newPod("fill-" + string(rune('a'+i)))
		if _, err := n.add(list, p); err != nil {
			lastErr = err
			pods = append(pods, p)
			break
		}
		pods = append(pods, p)
	}
	if lastErr == nil {
		t.Fatal("16 ADDs fit into a /29")
	}
	failed := pods[len(pods)-1]
	pods = pods[:len(pods)-1]
	if code := cniCode(t, lastErr); code != cni.ErrAllocation {
		t.Errorf("exhausted pool: code %d (%v), want %d", code, lastErr, cni.ErrAllocation)
	}
	t.Logf("pool full after %d pods: %v", len(pods), lastErr)
	if len(pods) == 0 {
		t.Fatal("not a single pod fit")
	}
	if v := n.hostVeths(); len(v) != len(pods) {
		t.Errorf("%d veths for %d pods: the failed ADD left one behind? %v", len(v), len(pods), v)
	}
	if a := n.podAllocations(); len(a) != len(pods) {
		t.Errorf("%d allocations for %d pods: %v", len(a), len(pods), a)
	}
	if err := n.del(list, pods[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := n.add(list, failed); err != nil {
		t.Errorf("ADD after a DEL freed an address: %v", err)
	}
	for _, p := range append(pods[1:], failed) {
		if err := n.del(list, p); err != nil {
			t.Errorf("DEL %s: %v", p.name, err)
		}
	}
	n.assertClean("pool test")
}

// TestPrivilegedTendrilCNIRepeatedAdd: a runtime that retries ADD for an
// attachment that already exists (no DEL in between) gets a working
// attachment and exactly one endpoint for it, not an error or two.
func TestPrivilegedTendrilCNIRepeatedAdd(t *testing.T) {
	testutil.Privileged(t)
	n := startNode(t)
	list := n.confList("tendril-cni", "1.1.0", nil)
	a, b := n.newPod("again-a"), n.newPod("again-b")
	first := n.mustAdd(list, a)
	resB := n.mustAdd(list, b)
	second := n.mustAdd(list, a)
	var count int
	for _, ep := range n.endpoints() {
		if ids := ep.Status.ExternalIdentifiers; ids != nil && ids.ContainerID == a.rt.ContainerID {
			count++
		}
	}
	if count != 1 {
		t.Errorf("%d endpoints for the attachment after a repeated ADD, want 1", count)
	}
	t.Logf("first ADD %v, repeated ADD %v", first.IPs[0].Address.IP, second.IPs[0].Address.IP)
	for _, ip := range second.IPs {
		if err := ping(b, ip.Address.IP.String()); err != nil {
			t.Error(err)
		}
	}
	for _, ip := range resB.IPs {
		if err := ping(a, ip.Address.IP.String()); err != nil {
			t.Error(err)
		}
	}
	if err := n.check(list, a); err != nil {
		t.Errorf("CHECK after repeated ADD: %v", err)
	}
	for _, p := range []*pod{a, b} {
		if err := n.del(list, p); err != nil {
			t.Errorf("DEL %s: %v", p.name, err)
		}
	}
	n.assertClean("repeated ADD")
}
