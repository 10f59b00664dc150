package e2e_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/lab"
)

// hostEcho dials addr from the network namespace netnsName, sends a line
// and reads it back from the lab's echo server: nil when the connection
// works end to end.
func hostEcho(t *testing.T, netnsName string, addr netip.AddrPort) error {
	t.Helper()
	var res error
	inNetns(t, netnsName, func() error {
		c, err := net.DialTimeout("tcp", addr.String(), 3*time.Second)
		if err != nil {
			res = err
			return nil
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		msg := []byte("tendril-wgfw\n")
		if _, err := c.Write(msg); err != nil {
			res = err
			return nil
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(c, got); err != nil {
			res = fmt.Errorf("read the echo: %w", err)
		}
		return nil
	})
	return res
}

// TestPrivilegedLabWireGuardHostFirewall: the host firewall on what
// arrives through the WireGuard device. A lab with --encryption wireguard,
// the agents restarted with --wireguard-encrypt-node and
// --enable-host-firewall, and a host policy selecting node2 that admits
// the cluster on one TCP port of node2 (and the other node on the
// WireGuard port, so the tunnel itself stays up). A pod on node1
// connecting to node2's own address goes through the device (a capture
// on node2's bridge port sees none of it in the clear, only WireGuard
// datagrams): on the allowed port it is answered, on another it is
// dropped, counted on node2 as "Policy denied" at ingress; node1's host
// alike. node2's own connection to node1 through the device gets its
// replies in (its conntrack entry written at the device's egress,
// to_wireguard), though the policy admits nothing from node1 on that
// port. Before the change from_wireguard checked nothing: the denied port
// was answered.
func TestPrivilegedLabWireGuardHostFirewall(t *testing.T) {
	labUp(t) // the binaries; the lab is this test's own
	name, e := ownLab(t, "hf", "--encryption", "wireguard")
	ctx := context.Background()
	node1, err := e.st.Node("node1")
	if err != nil {
		t.Fatal(err)
	}
	node2, err := e.st.Node("node2")
	if err != nil {
		t.Fatal(err)
	}
	n1, n2 := netip.MustParseAddr(node1.Address), netip.MustParseAddr(node2.Address)

	const ns = "e2e-wgfw"
	e.createNamespace(t, ns)
	e.createPod(t, ns, "client", "node1", map[string]string{"app": "wgfw-client"})
	client := e.waitReady(t, ns, "client")
	pods := map[netip.Addr]string{netip.MustParseAddr(client.Status.PodIP): "client"}

	const allowed, denied, node1Port = 5321, 5322, 5331
	echoServer(t, node2.Netns, netip.AddrPortFrom(n2, allowed))
	echoServer(t, node2.Netns, netip.AddrPortFrom(n2, denied))
	echoServer(t, node1.Netns, netip.AddrPortFrom(n1, node1Port))

	argvs := restartAgents(t, e, nil, "--wireguard-encrypt-node", "--enable-host-firewall")
	t.Cleanup(func() { restartAgents(t, e, argvs) })
	for i, n := range []*lab.Node{node1, node2} {
		other := []*lab.Node{node2, node1}[i]
		eventually(t, n.Name+" routes "+other.Address+" through its device", func() (bool, error) {
			out, err := exec.Command("nsenter", "--net="+lab.NetnsPath(n.Netns), "ip", "-4", "route", "show", "table", "21591").CombinedOutput()
			return err == nil && strings.Contains(string(out), other.Address+" dev "+lab.WireGuardDevice(name, i)), fmt.Errorf("%v: %s", err, out)
		})
	}
	// Through the device, before any host policy: both ports answer.
	for _, port := range []uint16{allowed, denied} {
		eventually(t, fmt.Sprintf("client -> node2:%d through the device, no host policy", port), func() (bool, error) {
			code, clear, wg := podToNodeCaptured(t, name, e, ns+"/client", pods, n1, n2, port)
			if clear > 0 {
				t.Fatalf("client -> node2:%d: %d frames in the clear with node encryption", port, clear)
			}
			return code == 0 && wg > 0, fmt.Errorf("exit %d, %d WireGuard datagrams", code, wg)
		})
	}

	pol := &v1alpha1.TendrilClusterwideNetworkPolicy{}
	doc := fmt.Sprintf(`
metadata: {name: e2e-wg-host-fw}
spec:
  nodeSelector: {matchLabels: {kubernetes.io/hostname: %s}}
  ingress:
  - fromEntities: [remote-node]
    toPorts: [{ports: [{port: "51871", protocol: UDP}]}]
  - fromEntities: [cluster]
    toPorts: [{ports: [{port: "%d", protocol: TCP}]}]
`, node2.Name, allowed)
	if err := yaml.UnmarshalStrict([]byte(doc), pol); err != nil {
		t.Fatal(err)
	}
	tcnp := e.k8.Tendril.TendrilV1alpha1().TendrilClusterwideNetworkPolicies()
	if _, err := tcnp.Create(ctx, pol, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tcnp.Delete(ctx, "e2e-wg-host-fw", metav1.DeleteOptions{}) })
	eventually(t, "node2 enforcing its ingress", func() (bool, error) {
		v := hostMetric(t, node2.Socket, "tendril_host_firewall_enforced", map[string]string{"direction": "ingress"})
		return v == 1, fmt.Errorf("tendril_host_firewall_enforced{direction=ingress} = %g", v)
	})

	// The denied port: dropped at node2's device, counted there.
	eventually(t, "client -> node2's denied port dropped at node2's device", func() (bool, error) {
		before := datapathCount(t, *node2, "Policy denied", "ingress")
		code, clear, wg := podToNodeCaptured(t, name, e, ns+"/client", pods, n1, n2, denied)
		if clear > 0 {
			t.Fatalf("client -> node2:%d: %d frames in the clear with node encryption", denied, clear)
		}
		after := datapathCount(t, *node2, "Policy denied", "ingress")
		return code != 0 && wg > 0 && after > before,
			fmt.Errorf("exit %d, %d WireGuard datagrams, node2's ingress policy drops %d -> %d", code, wg, before, after)
	})
	// The allowed port still answers through the device.
	code, clear, wg := podToNodeCaptured(t, name, e, ns+"/client", pods, n1, n2, allowed)
	if code != 0 || clear > 0 || wg == 0 {
		t.Fatalf("client -> node2's allowed port %d under the host policy: exit %d, %d frames in the clear, %d WireGuard datagrams; want 0, 0, some",
			allowed, code, clear, wg)
	}

	// node1's host (its traffic to node2 goes through the device too).
	if err := hostEcho(t, node1.Netns, netip.AddrPortFrom(n2, allowed)); err != nil {
		t.Errorf("node1's host -> node2's allowed port: %v", err)
	}
	before := datapathCount(t, *node2, "Policy denied", "ingress")
	if err := hostEcho(t, node1.Netns, netip.AddrPortFrom(n2, denied)); err == nil {
		t.Errorf("node1's host -> node2's denied port %d through the device: answered", denied)
	}
	if after := datapathCount(t, *node2, "Policy denied", "ingress"); after <= before {
		t.Errorf("node1's host -> node2:%d: node2's ingress policy drops %d -> %d, want more", denied, before, after)
	}

	// node2's own connection to node1 through the device: the replies
	// from node1's port, which the policy does not admit, are a known
	// flow's.
	if err := hostEcho(t, node2.Netns, netip.AddrPortFrom(n1, node1Port)); err != nil {
		t.Errorf("node2's host -> node1:%d through the device under node2's ingress policy: %v", node1Port, err)
	}
}
