package e2e_test

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/tendril-net/tendril/pkg/controlplane"
	"github.com/tendril-net/tendril/pkg/lab"
)

// TestPrivilegedClusterDNSService checks what `lab up` makes for the
// cluster DNS: the kube-dns Service at 10.96.0.10 in kube-system with
// kubeadm's labels and ports, a Ready CoreDNS pod on each node, and the
// EndpointSlice controller listing both behind it on UDP and TCP 53.
func TestPrivilegedClusterDNSService(t *testing.T) {
	e := labUp(t)
	ctx := context.Background()
	if !netip.MustParsePrefix(controlplane.ServiceCIDR).Contains(netip.MustParseAddr(lab.ClusterDNSIP)) {
		t.Fatalf("service CIDR %s does not cover %s", controlplane.ServiceCIDR, lab.ClusterDNSIP)
	}
	svc, err := e.cs.CoreV1().Services(lab.DNSNamespace).Get(ctx, lab.DNSServiceName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if svc.Spec.ClusterIP != lab.ClusterDNSIP || svc.Labels["k8s-app"] != "kube-dns" || svc.Spec.Selector["k8s-app"] != "kube-dns" {
		t.Fatalf("kube-dns: clusterIP %s, labels %v, selector %v", svc.Spec.ClusterIP, svc.Labels, svc.Spec.Selector)
	}
	ports := map[string]corev1.Protocol{}
	for _, p := range svc.Spec.Ports {
		if p.Port == 53 {
			ports[p.Name] = p.Protocol
		}
	}
	if ports["dns"] != corev1.ProtocolUDP || ports["dns-tcp"] != corev1.ProtocolTCP {
		t.Fatalf("kube-dns ports %v, want dns 53/UDP and dns-tcp 53/TCP", svc.Spec.Ports)
	}
	pods, err := e.cs.CoreV1().Pods(lab.DNSNamespace).List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=kube-dns"})
	if err != nil {
		t.Fatal(err)
	}
	var podIPs, nodes []string
	for i := range pods.Items {
		p := &pods.Items[i]
		if !lab.PodReady(p) {
			t.Errorf("CoreDNS pod %s not Ready: %+v", p.Name, p.Status)
		}
		podIPs, nodes = append(podIPs, p.Status.PodIP), append(nodes, p.Spec.NodeName)
	}
	slices.Sort(nodes)
	if !slices.Equal(nodes, []string{"node1", "node2"}) {
		t.Fatalf("CoreDNS pods on nodes %v, want one on node1 and one on node2", nodes)
	}
	eventually(t, "both CoreDNS pods ready behind kube-dns", func() (bool, error) {
		sl, err := e.cs.DiscoveryV1().EndpointSlices(lab.DNSNamespace).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + lab.DNSServiceName})
		if err != nil {
			return false, err
		}
		var ready []string
		for _, s := range sl.Items {
			for _, ep := range s.Endpoints {
				if ep.Conditions.Ready != nil && *ep.Conditions.Ready {
					ready = append(ready, ep.Addresses...)
				}
			}
		}
		slices.Sort(ready)
		slices.Sort(podIPs)
		return slices.Equal(ready, podIPs), fmt.Errorf("ready endpoints %v, pods %v", ready, podIPs)
	})
}

// TestPrivilegedClusterDNSFromPods resolves Service names from pods on
// both nodes through CoreDNS at the kube-dns ClusterIP, translated by the
// agents' service load-balancing: with glibc (getent, curl) under the
// resolv.conf that `lab exec` mounts for the pod, and with `lab probe`'s
// own resolver over UDP and over TCP; then reaches the Service found and
// the kubernetes Service (TLS verified for its name, the API server
// answering) from each pod. The machine's /etc/resolv.conf stays as it
// was.
func TestPrivilegedClusterDNSFromPods(t *testing.T) {
	e := labUp(t)
	ctx := context.Background()
	machineResolvConf, err := os.ReadFile(lab.MachineResolvConf)
	if err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "dns-e2e", Namespace: "default"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{lab.LabelApp: lab.LabApp},
			Ports: []corev1.ServicePort{
				{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 8080, TargetPort: intstr.FromInt32(80)},
				{Name: "udp", Protocol: corev1.ProtocolUDP, Port: 8081, TargetPort: intstr.FromInt32(81)},
			}},
	}
	created, err := e.cs.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.cs.CoreV1().Services("default").Delete(context.Background(), svc.Name, metav1.DeleteOptions{})
	})
	clusterIP := created.Spec.ClusterIP

	// pod-1 runs on node1 and pod-2 on node2 (round robin).
	for _, pod := range []string{"default/pod-1", "default/pod-2"} {
		rec, err := e.st.Pod("default", strings.TrimPrefix(pod, "default/"))
		if err != nil {
			t.Fatal(err)
		}
		t.Run(rec.Node, func(t *testing.T) {
			code, out := tendril(t, "exec", pod, "--", "cat", "/etc/resolv.conf")
			if code != 0 || out != lab.ResolvConf("default") {
				t.Fatalf("%s's /etc/resolv.conf (exit %d):\n%s\nwant\n%s", pod, code, out, lab.ResolvConf("default"))
			}
			// glibc: the short name through the search list, over UDP.
			eventually(t, "getent hosts dns-e2e from "+pod, func() (bool, error) {
				code, out := tendril(t, "exec", pod, "--", "getent", "ahostsv4", "dns-e2e")
				return code == 0 && strings.HasPrefix(out, clusterIP+" "), fmt.Errorf("exit %d: %s", code, out)
			})
			code, out = tendril(t, "exec", pod, "--", "getent", "ahostsv4", "kubernetes.default")
			if code != 0 || !strings.HasPrefix(out, controlplane.KubernetesSvcIP+" ") {
				t.Fatalf("getent ahostsv4 kubernetes.default: exit %d:\n%s", code, out)
			}
			// The probe's resolver: DNS over UDP, then over TCP; the
			// Service answers over TCP and UDP.
			for _, c := range []struct {
				target string
				args   []string
				dns    string
			}{
				{"dns-e2e:8080", nil, "UDP"},
				{"dns-e2e.default:8080", []string{"--dns-tcp"}, "TCP"},
				{"dns-e2e.default.svc.cluster.local:8081", []string{"--udp"}, "UDP"},
				{"dns-e2e:8081", []string{"--udp", "--dns-tcp"}, "TCP"},
			} {
				code, out := tendril(t, append([]string{"probe", pod, c.target, "--timeout", "2s"}, c.args...)...)
				wantResolved := fmt.Sprintf("dns-e2e.default.svc.cluster.local. is %s, DNS over %s", clusterIP, c.dns)
				if code != 0 || !strings.Contains(out, wantResolved) || !strings.Contains(out, `answered "pod-`) {
					t.Errorf("probe %s %v: exit %d, want %q and an answer from a lab pod:\n%s", c.target, c.args, code, wantResolved, out)
				}
			}
			// A name no Service has: NXDOMAIN through the whole search list.
			code, out = tendril(t, "probe", pod, "no-such-service:80", "--timeout", "2s")
			if code != 1 || !strings.Contains(out, "no such host") {
				t.Errorf("probe no-such-service: exit %d, want 1 and no such host:\n%s", code, out)
			}
			// The kubernetes Service from the pod: TLS verified for the name
			// it was reached by, over DNS over UDP and TCP.
			for _, args := range [][]string{{"kubernetes.default:443", "--tls"}, {"kubernetes.default.svc.cluster.local:443", "--tls", "--dns-tcp"}} {
				code, out := tendril(t, append([]string{"probe", pod, "--timeout", "3s"}, args...)...)
				if code != 0 || !strings.Contains(out, `answered "kube-apiserver"`) {
					t.Errorf("probe %v: exit %d:\n%s", args, code, out)
				}
			}
			// And with curl: glibc resolution, TLS for the name, the API
			// server's answer.
			code, out = tendril(t, "exec", pod, "--", "curl", "-sS", "--max-time", "5", "--cacert", e.st.CAFile(), "https://kubernetes.default/version")
			if code != 0 || !strings.Contains(out, `"minor": "36"`) {
				t.Errorf("curl https://kubernetes.default/version from %s: exit %d:\n%s", pod, code, out)
			}
		})
	}
	after, err := os.ReadFile(lab.MachineResolvConf)
	if err != nil || !bytes.Equal(after, machineResolvConf) {
		t.Fatalf("the machine's %s changed (%v):\nbefore %q\nafter  %q", lab.MachineResolvConf, err, machineResolvConf, after)
	}
}

// TestPrivilegedServiceByPerPacketNAT probes a ClusterIP from a pod's
// network namespace but outside every node's cgroup: no node's socket
// hooks record the connect, and the Service still answers, translated
// per packet by the pod programs. The name is resolved the same way (DNS
// to kube-dns per packet too).
func TestPrivilegedServiceByPerPacketNAT(t *testing.T) {
	e := labUp(t)
	ctx := context.Background()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "pernat-e2e", Namespace: "default"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{lab.LabelApp: lab.LabApp},
			Ports: []corev1.ServicePort{{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 8090, TargetPort: intstr.FromInt32(80)}}},
	}
	created, err := e.cs.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.cs.CoreV1().Services("default").Delete(context.Background(), svc.Name, metav1.DeleteOptions{})
	})
	frontend := netip.AddrPortFrom(netip.MustParseAddr(created.Spec.ClusterIP), 8090)
	for _, pod := range []string{"default/pod-1", "default/pod-2"} {
		eventually(t, "an answer at the ClusterIP from "+pod+" outside the node cgroups", func() (bool, error) {
			code, out := tendril(t, "probe", pod, frontend.String(), "--outside-node-cgroup", "--timeout", "1s")
			return code == 0 && strings.Contains(out, `answered "pod-`), fmt.Errorf("exit %d: %s", code, out)
		})
		code, out := tendril(t, "probe", pod, "pernat-e2e:8090", "--outside-node-cgroup", "--timeout", "2s")
		if code != 0 || !strings.Contains(out, `answered "pod-`) {
			t.Errorf("by name, outside the node cgroups, from %s: exit %d:\n%s", pod, code, out)
		}
	}
	for _, n := range e.st.Nodes {
		if recorded := socketRevNATFor(t, n.BPFRoot, frontend); recorded != 0 {
			t.Errorf("node %s: socket hooks translated %d connects to %s from outside the node cgroups", n.Name, recorded, frontend)
		}
	}
	// The same probe inside the node's cgroup is the socket hooks' job.
	if code, out := tendril(t, "probe", "default/pod-1", frontend.String(), "--timeout", "1s"); code != 0 {
		t.Fatalf("inside the node cgroup: exit %d:\n%s", code, out)
	}
	rec, err := e.st.Pod("default", "pod-1")
	if err != nil {
		t.Fatal(err)
	}
	node, _ := e.st.Node(rec.Node)
	if socketRevNATFor(t, node.BPFRoot, frontend) == 0 {
		t.Fatalf("node %s: a probe inside the node cgroup left no socket reverse NAT entry: the check above could not tell", node.Name)
	}
}

// TestPrivilegedLabWorldName: the lab's name for the world, WorldName, is
// answered by the cluster DNS (CoreDNS's hosts entry) with the world
// server's address, and a pod on each node reaches the world server by
// that name: through the search list over UDP (glibc and lab probe), and
// over TCP. Another name of the zone resolves to nothing.
func TestPrivilegedLabWorldName(t *testing.T) {
	e := labUp(t)
	if e.st.World == nil {
		t.Fatal("the lab has no world")
	}
	for _, n := range e.st.Nodes {
		ref := "default/" + e.labPodOn(t, n.Name).Name
		t.Run(n.Name, func(t *testing.T) {
			code, out := tendril(t, "exec", ref, "--", "getent", "ahostsv4", lab.WorldName)
			if code != 0 || !strings.HasPrefix(out, lab.WorldServerIP+" ") {
				t.Fatalf("getent ahostsv4 %s from %s: exit %d, want %s:\n%s", lab.WorldName, ref, code, lab.WorldServerIP, out)
			}
			for _, args := range [][]string{nil, {"--dns-tcp"}} {
				code, out := tendril(t, append([]string{"probe", ref, fmt.Sprintf("%s:%d", lab.WorldName, lab.WorldServerPorts[0]), "--timeout", "2s"}, args...)...)
				wantResolved := fmt.Sprintf("%s. is %s", lab.WorldName, lab.WorldServerIP)
				if m := peerAnswer.FindStringSubmatch(out); code != 0 || !strings.Contains(out, wantResolved) || m == nil || m[1] != "world" {
					t.Errorf("probe %s %s %v: exit %d, want %q and the world server's answer:\n%s", ref, lab.WorldName, args, code, wantResolved, out)
				}
			}
			code, out = tendril(t, "probe", ref, "nothing."+lab.WorldZone+":80", "--timeout", "2s")
			if code != 1 || strings.Contains(out, lab.WorldServerIP) {
				t.Errorf("probe nothing.%s: exit %d, want 1 and no address:\n%s", lab.WorldZone, code, out)
			}
		})
	}
}
