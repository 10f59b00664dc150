package e2e_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/tendril-net/tendril/pkg/agent/l2announcer"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/lab"
	"github.com/tendril-net/tendril/pkg/loadbalancer"
)

// l2Env is what the L2 announcements test reads of the lab.
type l2Env struct {
	*env
	t  *testing.T
	ns string
}

// holder is the node holding the service's announcement lease ("" none).
func (e l2Env) holder(svc string) (string, error) {
	l, err := e.cs.CoordinationV1().Leases("kube-system").Get(context.Background(),
		l2announcer.LeaseName(loadbalancer.ServiceName{Namespace: e.ns, Name: svc}), metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	if l.Spec.HolderIdentity == nil {
		return "", nil
	}
	return *l.Spec.HolderIdentity, nil
}

// worldNeigh is the MAC the world's neighbour table holds for addr ("" none).
func (e l2Env) worldNeigh(addr string) string {
	out, _ := exec.Command("nsenter", "--net="+lab.NetnsPath(e.st.World.Netns), "ip", "neigh", "show", addr).CombinedOutput()
	f := strings.Fields(string(out))
	for i := range f {
		if f[i] == "lladdr" && i+1 < len(f) {
			return f[i+1]
		}
	}
	return ""
}

// nodeMAC is the MAC of a node's uplink (eth0, on the bridge).
func (e l2Env) nodeMAC(node string) string {
	n, err := e.st.Node(node)
	if err != nil {
		e.t.Fatal(err)
	}
	// Through ip: nsenter keeps the machine's /sys.
	out, err := exec.Command("nsenter", "--net="+lab.NetnsPath(n.Netns), "ip", "-br", "link", "show", "eth0").CombinedOutput()
	f := strings.Fields(string(out))
	if err != nil || len(f) < 3 {
		e.t.Fatalf("MAC of %s: %v: %s", node, err, out)
	}
	return f[2]
}

// arpAnswers sends one ARP request for addr from the world's eth0 (as its
// gateway address) and returns the sender MACs of the replies that arrive
// within the collection window, sorted: who answers for addr on the
// bridge.
func (e l2Env) arpAnswers(addr string) ([]string, error) {
	target, err := netip.ParseAddr(addr)
	if err != nil {
		return nil, err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return nil, err
	}
	defer orig.Close()
	world, err := netns.GetFromPath(lab.NetnsPath(e.st.World.Netns))
	if err != nil {
		return nil, err
	}
	defer world.Close()
	if err := netns.Set(world); err != nil {
		return nil, err
	}
	defer func() { _ = netns.Set(orig) }()
	link, err := netlink.LinkByName("eth0")
	if err != nil {
		return nil, err
	}
	// The packet socket wants the protocol in network order.
	proto := maps.Htons(unix.ETH_P_ARP)
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(proto))
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	sa := &unix.SockaddrLinklayer{Protocol: proto, Ifindex: link.Attrs().Index, Halen: 6}
	if err := unix.Bind(fd, sa); err != nil {
		return nil, err
	}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 100000}); err != nil {
		return nil, err
	}
	// From the world's gateway address.
	req := l2announcer.ARPRequest(link.Attrs().HardwareAddr, netip.MustParseAddr(e.st.World.Gateway), target)
	bcast := &unix.SockaddrLinklayer{Protocol: proto, Ifindex: link.Attrs().Index, Halen: 6}
	copy(bcast.Addr[:], req[0:6])
	if err := unix.Sendto(fd, req, 0, bcast); err != nil {
		return nil, err
	}
	var got []string
	buf := make([]byte, 128)
	for end := time.Now().Add(time.Second); time.Now().Before(end); {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil || n < 42 {
			continue
		}
		f := buf[:n]
		if binary.BigEndian.Uint16(f[20:]) != 2 || netip.AddrFrom4([4]byte(f[28:32])) != target {
			continue
		}
		if m := net.HardwareAddr(f[22:28]).String(); !slices.Contains(got, m) {
			got = append(got, m)
		}
	}
	slices.Sort(got)
	return got, nil
}

// onlyAnswer waits until node alone answers ARP for addr.
func (e l2Env) onlyAnswer(addr, node string) {
	mac := e.nodeMAC(node)
	eventually(e.t, fmt.Sprintf("%s alone answering ARP for %s", node, addr), func() (bool, error) {
		got, err := e.arpAnswers(addr)
		if err != nil {
			return false, err
		}
		return len(got) == 1 && got[0] == mac, fmt.Errorf("answers from %v, want only %s's %s", got, node, mac)
	})
}

// lbAddress waits for the operator to give the service an address.
func (e l2Env) lbAddress(svc string) string {
	var addr string
	eventually(e.t, "a load-balancer address for "+svc, func() (bool, error) {
		s, err := e.cs.CoreV1().Services(e.ns).Get(context.Background(), svc, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, in := range s.Status.LoadBalancer.Ingress {
			addr = in.IP
			return true, nil
		}
		return false, fmt.Errorf("no ingress yet")
	})
	return addr
}

// answeredBy waits until a TCP probe from the world to addr:80 is answered
// by pod, announced by node (its lease, and the world's neighbour entry
// holds node's MAC), and returns the source the pod saw.
func (e l2Env) answeredBy(svc, addr, pod, node string) string {
	mac := e.nodeMAC(node)
	var src string
	eventually(e.t, fmt.Sprintf("%s (%s) announced by %s and answered by %s", svc, addr, node, pod), func() (bool, error) {
		h, err := e.holder(svc)
		if err != nil || h != node {
			return false, fmt.Errorf("lease holder %q (%v)", h, err)
		}
		name, s, _, err := fromWorld(e.t, net.JoinHostPort(addr, "80"), false)
		if err != nil {
			return false, err
		}
		if name != pod {
			return false, fmt.Errorf("answered by %s", name)
		}
		if got := e.worldNeigh(addr); got != mac {
			return false, fmt.Errorf("world's neighbour entry of %s: %q, want %s's %s", addr, got, node, mac)
		}
		src = s
		return true, nil
	})
	return src
}

// TestPrivilegedLabL2Announcements: LoadBalancer addresses from the lab's
// pool (tendril-operator) reach the world on-link, with no route, through
// the ARP answers of the node holding the service's lease:
//   - externalTrafficPolicy Cluster: the world's ARP request is answered
//     by the elected node's eth0 MAC, and the service answers;
//   - externalTrafficPolicy Local: only the node with the ready backend
//     announces (the client's address is kept); when the backend moves to
//     the other node, the announcement moves with it;
//   - the announcing node's agent stopped (SIGTERM) and restarted: its
//     lease and its responder map entry are kept, and it announces on;
//   - the announcing node's agent killed (SIGKILL: its lease is not
//     released): the other node takes the lease once it expires, its
//     gratuitous ARP moves the world's neighbour entry, and the world
//     reaches the service through it; the killed node's datapath stops
//     answering ARP for it (one node answers, before and after).
func TestPrivilegedLabL2Announcements(t *testing.T) {
	base := labUp(t)
	if base.st.World == nil {
		t.Fatal("the lab has no world")
	}
	ctx := context.Background()
	e := l2Env{env: base, t: t, ns: "e2e-l2"}
	e.createNamespace(t, e.ns)
	t.Cleanup(func() { _ = e.cs.CoreV1().Namespaces().Delete(ctx, e.ns, metav1.DeleteOptions{}) })
	node1, node2 := e.st.Nodes[0].Name, e.st.Nodes[1].Name
	backend := func(name, node, app string) {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name, Labels: map[string]string{"app": app}},
			Spec: corev1.PodSpec{
				NodeSelector: map[string]string{"kubernetes.io/hostname": node},
				Containers:   []corev1.Container{{Name: "main", Image: "lab", Args: []string{"--report-peer"}}},
			},
		}
		if _, err := e.cs.CoreV1().Pods(e.ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		e.waitReady(t, e.ns, name)
	}
	service := func(name, app string, etp corev1.ServiceExternalTrafficPolicy) {
		if _, err := e.cs.CoreV1().Services(e.ns).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ExternalTrafficPolicy: etp, Selector: map[string]string{"app": app},
				Ports: []corev1.ServicePort{{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(80)}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	backend("l2-a", node1, "l2")
	backend("l2-local-1", node1, "l2-local")
	service("l2", "l2", corev1.ServiceExternalTrafficPolicyCluster)
	service("l2-local", "l2-local", corev1.ServiceExternalTrafficPolicyLocal)
	pool := netip.MustParsePrefix(lab.LBPoolCIDR)
	addr, localAddr := e.lbAddress("l2"), e.lbAddress("l2-local")
	for _, a := range []string{addr, localAddr} {
		if ip, err := netip.ParseAddr(a); err != nil || !pool.Contains(ip) {
			t.Fatalf("load-balancer address %q not from the lab's pool %s", a, pool)
		}
		// On-link in the world: no route names it.
		out, err := exec.Command("nsenter", "--net="+lab.NetnsPath(e.st.World.Netns), "ip", "route", "get", a).CombinedOutput()
		if err != nil || strings.Contains(string(out), " via ") {
			t.Fatalf("world's route to %s: %v: %s (want on-link)", a, err, out)
		}
	}

	// Cluster: whichever node won, it answers ARP for the address.
	var won string
	eventually(t, "a holder of the l2 lease", func() (bool, error) {
		h, err := e.holder("l2")
		won = h
		return h == node1 || h == node2, fmt.Errorf("holder %q (%v)", h, err)
	})
	e.answeredBy("l2", addr, "l2-a", won)
	e.onlyAnswer(addr, won)

	// Local: node 1 holds the backend, so node 1 announces; the client's
	// address is kept.
	if src := e.answeredBy("l2-local", localAddr, "l2-local-1", node1); src != e.st.World.ClientIP {
		t.Fatalf("externalTrafficPolicy Local: backend saw %s, want the world client %s", src, e.st.World.ClientIP)
	}
	// The backend moves to node 2: node 1 gives the lease up, node 2 takes
	// it and its gratuitous ARP moves the world.
	if err := e.cs.CoreV1().Pods(e.ns).Delete(ctx, "l2-local-1", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "l2-local-1 gone", func() (bool, error) {
		_, err := e.cs.CoreV1().Pods(e.ns).Get(ctx, "l2-local-1", metav1.GetOptions{})
		return apierrors.IsNotFound(err), err
	})
	backend("l2-local-2", node2, "l2-local")
	moved := time.Now()
	e.answeredBy("l2-local", localAddr, "l2-local-2", node2)
	t.Logf("externalTrafficPolicy Local: announcement moved to %s with the backend, world answered %s after the new backend was ready",
		node2, time.Since(moved).Round(time.Millisecond))

	// The announcing node's agent stops (SIGTERM) and comes back: it keeps
	// its lease meanwhile (or the other node would have taken it at its
	// next 2 s try) and its datapath entry, and announces on.
	n, err := e.st.Node(won)
	if err != nil {
		t.Fatal(err)
	}
	argv := stopAgent(t, e.st, won)
	resp, err := maps.OpenPinnedL2Responder(n.BPFRoot, true)
	if err != nil {
		t.Fatal(err)
	}
	entries, err := resp.List()
	resp.Close()
	if err != nil {
		t.Fatal(err)
	}
	kept := false
	for k := range entries {
		kept = kept || k.Addr.String() == addr
	}
	if !kept {
		t.Fatalf("%s's responder map after its agent stopped: %v, want %s kept", won, entries, addr)
	}
	startAgent(t, e.st, won, argv)
	waitAgentAPI(t, *n)
	if h, err := e.holder("l2"); err != nil || h != won {
		t.Fatalf("after %s's agent restarted: lease holder %q (%v), want %s (kept across the stop)", won, h, err, won)
	}
	e.answeredBy("l2", addr, "l2-a", won)
	e.onlyAnswer(addr, won)

	// The announcing node's agent dies: the other node takes over once
	// the lease expires.
	other := node1
	if won == node1 {
		other = node2
	}
	argv = killAgent(t, e.st, won)
	killed := time.Now()
	t.Cleanup(func() {
		startAgent(t, e.st, won, argv)
		waitAgentAPI(t, *n)
	})
	e.answeredBy("l2", addr, "l2-a", other)
	// The dead agent's datapath stops answering once the entry it last
	// refreshed expires (a lease duration after): one answer again.
	e.onlyAnswer(addr, other)
	t.Logf("agent of %s killed: %s announces %s, world answered through it %s later (lease duration 15s)",
		won, other, addr, time.Since(killed).Round(time.Millisecond))
}

// TestPrivilegedLabL2AnnouncementRefusals: a Service's spec.externalIPs
// (anyone who may create a Service writes them, CVE-2020-8554) do not
// make a node answer ARP for them: not for the lab's gateway (the
// world's address, every node's default route), not for another node's
// address. The Service gets an L2AnnouncementRefused Event for each, no
// lease is campaigned for, and, once a load-balancer address of the
// lab's pool created after it is announced (the announcer has seen
// both), the world's ARP requests for the gateway get no answer from a
// node and those for node 2's address only node 2's.
func TestPrivilegedLabL2AnnouncementRefusals(t *testing.T) {
	base := labUp(t)
	if base.st.World == nil {
		t.Fatal("the lab has no world")
	}
	ctx := context.Background()
	e := l2Env{env: base, t: t, ns: "e2e-l2-refused"}
	e.createNamespace(t, e.ns)
	t.Cleanup(func() { _ = e.cs.CoreV1().Namespaces().Delete(ctx, e.ns, metav1.DeleteOptions{}) })
	node2 := e.st.Nodes[1]
	gateway := e.st.World.Gateway
	ports := []corev1.ServicePort{{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(80)}}
	if _, err := e.cs.CoreV1().Services(e.ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "hijack"},
		Spec: corev1.ServiceSpec{Ports: ports, ExternalIPs: []string{gateway, node2.Address}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cs.CoreV1().Services(e.ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "control"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: ports}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	addr := e.lbAddress("control")
	var holder string
	eventually(t, "a holder of control's lease", func() (bool, error) {
		h, err := e.holder("control")
		holder = h
		return h != "", fmt.Errorf("holder %q (%v)", h, err)
	})
	e.onlyAnswer(addr, holder)
	got, err := e.arpAnswers(gateway)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 0 {
		t.Fatalf("ARP for the gateway %s answered by %v, want no node", gateway, got)
	}
	got, err = e.arpAnswers(node2.Address)
	if err != nil {
		t.Fatal(err)
	}
	if mac := e.nodeMAC(node2.Name); len(got) != 1 || got[0] != mac {
		t.Fatalf("ARP for %s's address %s answered by %v, want only %s", node2.Name, node2.Address, got, mac)
	}
	if h, err := e.holder("hijack"); !apierrors.IsNotFound(err) {
		t.Fatalf("hijack's lease: holder %q, error %v; want no lease (no node is a candidate)", h, err)
	}
	eventually(t, "L2AnnouncementRefused events on hijack for "+gateway+" and "+node2.Address, func() (bool, error) {
		evs, err := e.cs.CoreV1().Events(e.ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=hijack,reason=L2AnnouncementRefused"})
		if err != nil {
			return false, err
		}
		var msgs []string
		for _, ev := range evs.Items {
			msgs = append(msgs, ev.Message)
		}
		all := strings.Join(msgs, "\n")
		return strings.Contains(all, gateway+" refused") && strings.Contains(all, node2.Address+" refused"), fmt.Errorf("events: %q", msgs)
	})
}
