package connectivity

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/tendril-net/tendril/pkg/k8s"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/lab"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// Config says where the test runs.
type Config struct {
	// Namespace is the test's own namespace (deleted and recreated).
	Namespace string
	// Nodes are two node names (pods are pinned to them) and their
	// addresses (for pod-to-host checks).
	Nodes   [2]string
	NodeIPs [2]string
	// NodeIPs6 are the nodes' IPv6 addresses in a dual-stack cluster;
	// empty skips the IPv6 checks.
	NodeIPs6 [2]string
	// APIServer is the API server's address as pods reach it (the
	// kubernetes Service's endpoint); empty skips the check.
	APIServer string
	// ClusterDNS is the cluster DNS Service's address (kube-dns), named in
	// the output; the DNS checks expect pods to resolve through it.
	ClusterDNS string
	// World is a server outside the cluster (IP) answering on TCP 80 and
	// UDP 81 with "<name> from <source address>:<port>" (the lab's world
	// server); empty skips the masquerade checks.
	World string
	// World6 is the same server's IPv6 address (dual stack); empty skips
	// the IPv6 masquerade check.
	World6 string
	// WorkloadImage is the image of the test's pods on real nodes (the
	// lab's State.WorkloadImage, imported into every node's containerd);
	// empty for the lab kubelet, which runs its own workload.
	WorkloadImage string
	// NoSharedL2 says the world and the nodes share no L2 segment (nodes
	// in different subnets behind a router): the L2 announcement check
	// has nothing to announce on and is left out, said in the output.
	NoSharedL2 bool
	Keep       bool
	// Phases, when set, runs only the phases whose title contains it
	// (the pods and Services are deployed all the same); a filter that
	// matches no phase is an error, not a pass.
	Phases string
	Settle time.Duration
	// DenyProbes is how many probes in a row a denied check needs dropped
	// (Runner.DenyProbes).
	DenyProbes int
	ReadyWait  time.Duration
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{Namespace: "tendril-connectivity", ClusterDNS: lab.ClusterDNSIP, Settle: 30 * time.Second, DenyProbes: 3, ReadyWait: 2 * time.Minute}
}

// The test's pods: a client and a second client on node 0, servers on
// node 0 and node 1, and a client on node 1 for Services reached from the
// other node. Lab workloads answer on TCP and UDP 80 and 81 with their
// pod's name.
const (
	podClient       = "client"
	podOtherClient  = "other-client"
	podServerSame   = "server-same-node"
	podServerOther  = "server-other-node"
	podRemoteClient = "remote-client"
)

// The host ports of the server on node 2 (TCP 80 and UDP 81).
const (
	hostPortTCP = 9080
	hostPortUDP = 9081
)

// The test's Services, all of them in front of both servers (app=server)
// on TCP 80 and UDP 81.
const (
	svcServers  = "servers"
	svcAffinity = "servers-affinity"
	svcLocal    = "servers-local"
	// svcNodePort is of type NodePort with externalTrafficPolicy Local:
	// clients in the cluster still reach both servers on either node's
	// address (kube-proxy's reading), outside clients only the node's own.
	svcNodePort = "servers-nodeport"
	// svcNodePortCluster is of type NodePort with externalTrafficPolicy
	// Cluster: outside clients reach both servers through either node.
	svcNodePortCluster = "servers-nodeport-cluster"
	// svcLoadBalancer is of type LoadBalancer (externalTrafficPolicy
	// Cluster): tendril-operator gives it an address from the lab's pool,
	// on the bridge's subnet, which one node answers ARP for (L2
	// announcements): the world reaches it on-link.
	svcLoadBalancer = "servers-lb"
)

// Probes per attempt of the Service checks that judge who answers: with
// two backends picked at random, a broken affinity or traffic policy
// still looks right with probability 2^-(n-1) (1/2048 for 12), and a
// working balancer misses one backend with the same probability.
const (
	serviceProbes  = 12
	spreadProbes   = 20
	clientIPProbes = 12
)

// Test deploys the pods, runs every check and cleans up; it returns the
// results (the caller prints the table and sets the exit code).
func Test(ctx context.Context, c *k8s.Clients, prober Prober, cfg Config, out io.Writer) ([]Result, error) {
	ns := cfg.Namespace
	begin := time.Now()
	fmt.Fprintf(out, "Deploying the connectivity test in namespace %s (nodes %s and %s)\n", ns, cfg.Nodes[0], cfg.Nodes[1])
	if err := deleteNamespace(ctx, c, ns); err != nil {
		return nil, err
	}
	if _, err := c.Core.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create namespace %s: %w", ns, err)
	}
	if !cfg.Keep {
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if err := deleteNamespace(ctx, c, ns); err != nil {
				fmt.Fprintf(out, "cleanup: %v\n", err)
			}
		}()
	}
	pods := map[string]struct {
		node int
		app  string
	}{podClient: {0, "client"}, podOtherClient: {0, "other-client"}, podServerSame: {0, "server"}, podServerOther: {1, "server"},
		podRemoteClient: {1, "remote-client"}}
	for name, p := range pods {
		if err := createPod(ctx, c, ns, name, cfg.Nodes[p.node], p.app, cfg.WorkloadImage); err != nil {
			return nil, err
		}
	}
	dual := cfg.NodeIPs6[0] != ""
	ips, ips6 := map[string]string{}, map[string]string{}
	for name := range pods {
		ip, ip6, err := waitReady(ctx, c, ns, name, cfg.ReadyWait)
		if err != nil {
			return nil, err
		}
		if dual && ip6 == "" {
			return nil, fmt.Errorf("pod %s/%s has no IPv6 address in a dual-stack cluster", ns, name)
		}
		ips[name], ips6[name] = ip, ip6
	}
	fmt.Fprintf(out, "Pods ready after %s\n", time.Since(begin).Round(time.Millisecond))
	clusterIPs, clusterIPs6 := map[string]string{}, map[string]string{}
	for _, name := range []string{svcServers, svcAffinity, svcLocal} {
		ip, ip6, err := createService(ctx, c, ns, name)
		if err != nil {
			return nil, err
		}
		if dual && ip6 == "" {
			return nil, fmt.Errorf("service %s/%s (PreferDualStack) got no IPv6 ClusterIP: has the API server an IPv6 service CIDR?", ns, name)
		}
		clusterIPs[name], clusterIPs6[name] = ip, ip6
		if err := waitEndpoints(ctx, c, ns, name, 2, cfg.ReadyWait); err != nil {
			return nil, err
		}
	}
	nodePorts, err := createNodePortService(ctx, c, ns, svcNodePort, corev1.ServiceExternalTrafficPolicyLocal)
	if err != nil {
		return nil, err
	}
	clusterNodePorts, err := createNodePortService(ctx, c, ns, svcNodePortCluster, corev1.ServiceExternalTrafficPolicyCluster)
	if err != nil {
		return nil, err
	}
	for _, name := range []string{svcNodePort, svcNodePortCluster} {
		if err := waitEndpoints(ctx, c, ns, name, 2, cfg.ReadyWait); err != nil {
			return nil, err
		}
	}
	fmt.Fprintf(out, "Services %s (%s), %s (%s, sessionAffinity ClientIP), %s (%s, internalTrafficPolicy Local), %s (node ports %d/TCP, %d/UDP) with 2 ready endpoints after %s\n\n",
		svcServers, clusterIPs[svcServers], svcAffinity, clusterIPs[svcAffinity], svcLocal, clusterIPs[svcLocal],
		svcNodePort, nodePorts[80], nodePorts[81], time.Since(begin).Round(time.Millisecond))
	nodePort := func(node, port int) string {
		return net.JoinHostPort(cfg.NodeIPs[node], strconv.Itoa(int(nodePorts[port])))
	}
	clusterNodePort := func(node, port int) string {
		return net.JoinHostPort(cfg.NodeIPs[node], strconv.Itoa(int(clusterNodePorts[port])))
	}

	from := func(pod string) string { return ns + "/" + pod }
	to := func(pod string, port int) string { return fmt.Sprintf("%s:%d", ips[pod], port) }
	svc := func(name string, port int) string { return fmt.Sprintf("%s:%d", clusterIPs[name], port) }
	servers := []string{podServerSame, podServerOther}
	viaService := func(name, client, service string, port int, proto string) Check {
		return Check{Name: name, From: from(client), To: svc(service, port), Proto: proto, Allowed: true, Backends: servers}
	}
	// By name: the short name through the pod's search list, or the
	// namespace-qualified and fully qualified names.
	byName := func(name string, port int) string { return fmt.Sprintf("%s:%d", name, port) }
	qualified := func(name string, port int) string { return fmt.Sprintf("%s.%s:%d", name, ns, port) }
	fqdn := func(name string, port int) string { return fmt.Sprintf("%s.%s.svc.cluster.local:%d", name, ns, port) }
	viaName := func(name, client, to, proto string) Check {
		return Check{Name: name, From: from(client), To: to, Proto: proto, Allowed: true, Backends: servers}
	}
	fqdnOverTCP := viaName("Service by FQDN, DNS over TCP", podRemoteClient, fqdn(svcServers, 80), "tcp")
	fqdnOverTCP.DNSTCP = true
	dnsChecks := []Check{
		viaName("Service by DNS name, same node, TCP", podClient, byName(svcServers, 80), "tcp"),
		viaName("Service by DNS name, same node, UDP", podClient, byName(svcServers, 81), "udp"),
		viaName("Service by DNS name, other node, TCP", podRemoteClient, qualified(svcServers, 80), "tcp"),
		viaName("Service by DNS name, other node, UDP", podRemoteClient, qualified(svcServers, 81), "udp"),
		fqdnOverTCP,
		{Name: "kubernetes Service by name (TLS), same node", From: from(podClient), To: "kubernetes.default:443", Proto: "tls", Allowed: true,
			Backends: []string{"kube-apiserver"}},
		{Name: "kubernetes Service by name (TLS), other node", From: from(podRemoteClient), To: "kubernetes.default.svc.cluster.local:443", Proto: "tls",
			Allowed: true, Backends: []string{"kube-apiserver"}, DNSTCP: true},
	}
	phases := []phase{
		{"no policy", nil, []Check{
			check("pod to pod, same node, TCP", from(podClient), to(podServerSame, 80), "tcp", true),
			check("pod to pod, same node, UDP", from(podClient), to(podServerSame, 81), "udp", true),
			check("pod to pod, other node, TCP", from(podClient), to(podServerOther, 80), "tcp", true),
			check("pod to pod, other node, UDP", from(podClient), to(podServerOther, 81), "udp", true),
			check("pod to pod, other node, ICMP", from(podClient), ips[podServerOther], "icmp", true),
			check("pod to host, own node", from(podClient), cfg.NodeIPs[0], "icmp", true),
			check("pod to host, other node", from(podClient), cfg.NodeIPs[1], "icmp", true),
		}},
		{"Services: ClusterIP in front of both servers", nil, []Check{
			viaService("ClusterIP, same node, TCP", podClient, svcServers, 80, "tcp"),
			viaService("ClusterIP, same node, UDP", podClient, svcServers, 81, "udp"),
			viaService("ClusterIP, other node, TCP", podRemoteClient, svcServers, 80, "tcp"),
			viaService("ClusterIP, other node, UDP", podRemoteClient, svcServers, 81, "udp"),
			{Name: "ClusterIP balances over both backends", From: from(podClient), To: svc(svcServers, 80), Proto: "tcp", Allowed: true,
				Backends: servers, Repeat: spreadProbes, Spread: true},
			{Name: "sessionAffinity ClientIP: one backend", From: from(podClient), To: svc(svcAffinity, 80), Proto: "tcp", Allowed: true,
				Backends: servers, Repeat: clientIPProbes, Sticky: true},
			{Name: "internalTrafficPolicy Local, node 1", From: from(podClient), To: svc(svcLocal, 80), Proto: "tcp", Allowed: true,
				Backends: []string{podServerSame}, Repeat: serviceProbes},
			{Name: "internalTrafficPolicy Local, node 2, UDP", From: from(podRemoteClient), To: svc(svcLocal, 81), Proto: "udp", Allowed: true,
				Backends: []string{podServerOther}, Repeat: serviceProbes},
		}},
		// A node answers node ports on its own addresses; another node's
		// address is that node's to answer (its host program, like a
		// client from outside), not this node's socket hooks'.
		{"NodePort from pods on their node's address (socket load-balancing and per-packet NAT)", nil, []Check{
			{Name: "NodePort on the node's address, TCP", From: from(podClient), To: nodePort(0, 80), Proto: "tcp", Allowed: true, Backends: servers},
			{Name: "NodePort on the node's address, UDP, node 2", From: from(podRemoteClient), To: nodePort(1, 81), Proto: "udp", Allowed: true, Backends: servers},
			{Name: "NodePort balances over both (externalTrafficPolicy Local: in-cluster clients reach all)", From: from(podRemoteClient), To: nodePort(1, 80),
				Proto: "tcp", Allowed: true, Backends: servers, Repeat: spreadProbes, Spread: true},
			{Name: "NodePort by per-packet NAT, TCP", From: from(podClient), To: nodePort(0, 80), Proto: "tcp", Allowed: true,
				Backends: servers, OutsideNodeCgroup: true},
		}},
		{"Cluster DNS: Services by name through kube-dns (" + cfg.ClusterDNS + ")", nil, dnsChecks},
		{"Per-packet NAT: clients outside the node cgroups (no socket load-balancing)", nil, []Check{
			{Name: "ClusterIP by per-packet NAT, same node, TCP", From: from(podClient), To: svc(svcServers, 80), Proto: "tcp", Allowed: true,
				Backends: servers, OutsideNodeCgroup: true},
			{Name: "ClusterIP by per-packet NAT, same node, UDP", From: from(podClient), To: svc(svcServers, 81), Proto: "udp", Allowed: true,
				Backends: servers, OutsideNodeCgroup: true},
			{Name: "ClusterIP by per-packet NAT, other node, TCP", From: from(podRemoteClient), To: svc(svcServers, 80), Proto: "tcp", Allowed: true,
				Backends: servers, OutsideNodeCgroup: true},
			{Name: "ClusterIP by per-packet NAT, balances over both", From: from(podClient), To: svc(svcServers, 80), Proto: "tcp", Allowed: true,
				Backends: servers, Repeat: spreadProbes, Spread: true, OutsideNodeCgroup: true},
			{Name: "Service by DNS name by per-packet NAT, UDP", From: from(podRemoteClient), To: byName(svcServers, 81), Proto: "udp", Allowed: true,
				Backends: servers, OutsideNodeCgroup: true},
		}},
		{"TendrilNetworkPolicy: servers admit only app=client on TCP 80", func() error { return applyServerPolicy(ctx, c, ns) }, []Check{
			check("allowed client, same node", from(podClient), to(podServerSame, 80), "tcp", true),
			check("allowed client, other node", from(podClient), to(podServerOther, 80), "tcp", true),
			check("other client denied, same node", from(podOtherClient), to(podServerSame, 80), "tcp", false),
			check("other client denied, other node", from(podOtherClient), to(podServerOther, 80), "tcp", false),
			check("allowed client, port not in the policy", from(podClient), to(podServerOther, 81), "udp", false),
			// Policy sees the backend, never the ClusterIP: the rule that
			// admits app=client to the servers admits it via the Service.
			{Name: "allowed client via the ClusterIP", From: from(podClient), To: svc(svcServers, 80), Proto: "tcp", Allowed: true,
				Backends: servers, Repeat: spreadProbes, Spread: true},
			check("other client denied via the ClusterIP", from(podOtherClient), svc(svcServers, 80), "tcp", false),
		}},
		{"NetworkPolicy: other-client may only send to UDP 81 (egress)", func() error {
			if err := c.Tendril.TendrilV1alpha1().TendrilNetworkPolicies(ns).Delete(ctx, "servers-admit-client", metav1.DeleteOptions{}); err != nil {
				return err
			}
			return applyEgressPolicy(ctx, c, ns)
		}, []Check{
			check("egress to TCP 80 denied", from(podOtherClient), to(podServerOther, 80), "tcp", false),
			check("egress to UDP 81 allowed", from(podOtherClient), to(podServerOther, 81), "udp", true),
			// DNS is egress to the kube-dns backends like any other: the
			// policy allows UDP 81 only, so the name no longer resolves
			// although the Service behind it is allowed.
			check("egress policy without DNS: the name fails", from(podOtherClient), byName(svcServers, 81), "udp", false),
			check("unrestricted client unaffected", from(podClient), to(podServerOther, 80), "tcp", true),
		}},
		{"policies deleted", func() error {
			return c.Core.NetworkingV1().NetworkPolicies(ns).Delete(ctx, "other-client-egress", metav1.DeleteOptions{})
		}, []Check{
			check("connectivity restored, TCP", from(podOtherClient), to(podServerOther, 80), "tcp", true),
			check("connectivity restored, same node", from(podOtherClient), to(podServerSame, 80), "tcp", true),
		}},
	}
	if cfg.World != "" {
		// The world has no route to the pod CIDRs: an answer at all says
		// the traffic was masqueraded; its source says to which address.
		world := func(name, client string, node, port int, proto string) Check {
			return Check{Name: name, From: from(client), To: fmt.Sprintf("%s:%d", cfg.World, port), Proto: proto, Allowed: true,
				AnswerPrefix: "world from " + cfg.NodeIPs[node] + ":"}
		}
		phases = slices.Insert(phases, 1, phase{"Pod to world (" + cfg.World + "): masqueraded to the node address", nil, []Check{
			world("pod to world leaves with node 1's address, TCP", podClient, 0, 80, "tcp"),
			world("pod to world leaves with node 1's address, UDP", podClient, 0, 81, "udp"),
			check("pod to world, node 1, ICMP", from(podClient), cfg.World, "icmp", true),
			world("pod to world leaves with node 2's address, TCP", podRemoteClient, 1, 80, "tcp"),
			world("pod to world leaves with node 2's address, UDP", podRemoteClient, 1, 81, "udp"),
			check("pod to world, node 2, ICMP", from(podRemoteClient), cfg.World, "icmp", true),
		}})
		// Clients outside the cluster arrive at a node's device: its host
		// program translates (docs/services.md, "From outside").
		worldNP := func(name, to, proto string, backends []string, spread bool) Check {
			c := Check{Name: name, From: lab.WorldRef, To: to, Proto: proto, Allowed: true, Backends: backends, Repeat: serviceProbes, Spread: spread}
			if spread {
				c.Repeat = spreadProbes
			}
			return c
		}
		worldChecks := []Check{
			worldNP("world to NodePort, externalTrafficPolicy Local, node 1, TCP: its own server", nodePort(0, 80), "tcp", []string{podServerSame}, false),
			worldNP("world to NodePort, externalTrafficPolicy Local, node 2, UDP: its own server", nodePort(1, 81), "udp", []string{podServerOther}, false),
			worldNP("world to NodePort, externalTrafficPolicy Cluster, node 1, TCP: local and remote servers", clusterNodePort(0, 80), "tcp", servers, true),
			worldNP("world to NodePort, externalTrafficPolicy Cluster, node 2, UDP: local and remote servers", clusterNodePort(1, 81), "udp", servers, true),
			worldNP("world to a hostPort of the server on node 2, TCP", net.JoinHostPort(cfg.NodeIPs[1], strconv.Itoa(hostPortTCP)), "tcp", []string{podServerOther}, false),
			worldNP("world to a hostPort of the server on node 2, UDP", net.JoinHostPort(cfg.NodeIPs[1], strconv.Itoa(hostPortUDP)), "udp", []string{podServerOther}, false),
		}
		if cfg.NoSharedL2 {
			fmt.Fprintf(out, "The world and the nodes share no L2 segment: the L2 announcement check is left out\n")
		} else {
			lbAddr, err := createLoadBalancerService(ctx, c, ns, svcLoadBalancer, cfg.ReadyWait)
			if err != nil {
				return nil, err
			}
			fmt.Fprintf(out, "Service %s got load-balancer address %s\n", svcLoadBalancer, lbAddr)
			// No route to it in the world: its ARP request is answered
			// by the node holding the Service's lease.
			worldChecks = append(worldChecks, worldNP("world to a LoadBalancer address on-link (L2 announcement), TCP: both servers", net.JoinHostPort(lbAddr, "80"), "tcp", servers, true))
		}
		phases = append(phases, phase{"NodePort and hostPort from the world (host device programs)", nil, worldChecks})
	}
	if dual {
		phases = append(phases, ipv6Phase(cfg, ns, ips6, clusterIPs6, clusterNodePorts))
	}
	if cfg.APIServer != "" {
		phases[0].checks = append(phases[0].checks,
			check("pod to API server, other node", from(podServerOther), cfg.APIServer, "tcp-connect", true),
			check("pod to API server, same node", from(podClient), cfg.APIServer, "tcp-connect", true))
	}
	if cfg.Phases != "" {
		phases = slices.DeleteFunc(phases, func(ph phase) bool { return !strings.Contains(ph.title, cfg.Phases) })
		if len(phases) == 0 {
			return nil, fmt.Errorf("--phases %q: no phase of this cluster's test has it in its title", cfg.Phases)
		}
	}
	total := 0
	for _, ph := range phases {
		total += len(ph.checks)
	}
	runner := &Runner{Prober: prober, Out: out, ProbeTimeout: time.Second, Settle: cfg.Settle, DenyProbes: cfg.DenyProbes}
	var results []Result
	for _, ph := range phases {
		fmt.Fprintf(out, "--- %s\n", ph.title)
		if ph.before != nil {
			if err := ph.before(); err != nil {
				return results, fmt.Errorf("%s: %w", ph.title, err)
			}
		}
		results = append(results, runner.Run(ctx, total, len(results)+1, ph.checks)...)
	}
	fmt.Fprintln(out)
	return results, nil
}

// phase is a group of checks under a title, after an optional step.
type phase struct {
	title  string
	before func() error
	checks []Check
}

// createPod creates a test pod bound to node: the lab kubelet's workload,
// or with image a real container of the workload image.
func createPod(ctx context.Context, c *k8s.Clients, ns, name, node, app, image string) error {
	container := corev1.Container{Name: "workload", Image: "tendril.io/lab-workload"}
	if image != "" {
		container = lab.WorkloadContainer(image)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": app}},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{container}},
	}
	if name == podServerOther {
		// Its host ports, served by the node's programs (no portmap).
		pod.Spec.Containers[0].Ports = []corev1.ContainerPort{
			{ContainerPort: 80, HostPort: hostPortTCP, Protocol: corev1.ProtocolTCP},
			{ContainerPort: 81, HostPort: hostPortUDP, Protocol: corev1.ProtocolUDP},
		}
	}
	if _, err := c.Core.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create pod %s/%s: %w", ns, name, err)
	}
	return nil
}

// waitReady waits for the pod to be ready and returns its address and,
// in a dual-stack cluster, its IPv6 address (status.podIPs).
func waitReady(ctx context.Context, c *k8s.Clients, ns, name string, wait time.Duration) (ip, ip6 string, err error) {
	deadline := time.Now().Add(wait)
	for {
		p, err := c.Core.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil && p.Status.PodIP != "" && p.Status.Phase == corev1.PodRunning {
			for _, cond := range p.Status.Conditions {
				if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
					for _, a := range p.Status.PodIPs {
						if ip := net.ParseIP(a.IP); ip != nil && ip.To4() == nil {
							ip6 = a.IP
						}
					}
					return p.Status.PodIP, ip6, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return "", "", fmt.Errorf("pod %s/%s not ready after %s (last error: %v)", ns, name, wait, err)
		}
		select {
		case <-ctx.Done():
			return "", "", ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func deleteNamespace(ctx context.Context, c *k8s.Clients, ns string) error {
	err := c.Core.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete namespace %s: %w", ns, err)
	}
	for {
		if _, err := c.Core.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("namespace %s still terminating: %w", ns, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func applyServerPolicy(ctx context.Context, c *k8s.Clients, ns string) error {
	pol := &v1alpha1.TendrilNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "servers-admit-client", Namespace: ns},
		Spec: &api.Rule{
			EndpointSelector: &api.EndpointSelector{MatchLabels: map[string]string{"app": "server"}},
			Ingress: []api.IngressRule{{
				FromEndpoints: []api.EndpointSelector{{MatchLabels: map[string]string{"app": "client"}}},
				ToPorts:       []api.PortRule{{Ports: []api.PortProtocol{{Port: "80", Protocol: "TCP"}}}},
			}},
		},
	}
	_, err := c.Tendril.TendrilV1alpha1().TendrilNetworkPolicies(ns).Create(ctx, pol, metav1.CreateOptions{})
	return err
}

func applyEgressPolicy(ctx context.Context, c *k8s.Clients, ns string) error {
	udp := corev1.ProtocolUDP
	port := intstr.FromInt32(81)
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "other-client-egress", Namespace: ns},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "other-client"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress:      []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: &port}}}},
		},
	}
	_, err := c.Core.NetworkingV1().NetworkPolicies(ns).Create(ctx, np, metav1.CreateOptions{})
	return err
}

// check is a plain reachability check.
func check(name, from, to, proto string, allowed bool) Check {
	return Check{Name: name, From: from, To: to, Proto: proto, Allowed: allowed}
}

// preferDualStack gives a Service a ClusterIP of each family where the
// cluster has service CIDRs of both (one elsewhere).
var preferDualStack = corev1.IPFamilyPolicyPreferDualStack

// createService creates one of the test's Services in front of the
// servers and returns its ClusterIP and, in a dual-stack cluster, its
// IPv6 ClusterIP.
func createService(ctx context.Context, c *k8s.Clients, ns, name string) (ip, ip6 string, err error) {
	policy := preferDualStack
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.ServiceSpec{
			Selector:       map[string]string{"app": "server"},
			IPFamilyPolicy: &policy,
			Ports: []corev1.ServicePort{
				{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(80)},
				{Name: "udp", Protocol: corev1.ProtocolUDP, Port: 81, TargetPort: intstr.FromInt32(81)},
			},
		},
	}
	switch name {
	case svcAffinity:
		svc.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	case svcLocal:
		local := corev1.ServiceInternalTrafficPolicyLocal
		svc.Spec.InternalTrafficPolicy = &local
	}
	got, err := c.Core.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return "", "", fmt.Errorf("create service %s/%s: %w", ns, name, err)
	}
	if got.Spec.ClusterIP == "" || got.Spec.ClusterIP == corev1.ClusterIPNone {
		return "", "", fmt.Errorf("service %s/%s got no ClusterIP", ns, name)
	}
	for _, a := range got.Spec.ClusterIPs {
		if ip := net.ParseIP(a); ip != nil && ip.To4() == nil {
			ip6 = a
		}
	}
	return got.Spec.ClusterIP, ip6, nil
}

// createNodePortService creates a NodePort Service with the external
// traffic policy in front of the servers and returns its node port per
// port.
func createNodePortService(ctx context.Context, c *k8s.Clients, ns, name string, etp corev1.ServiceExternalTrafficPolicy) (map[int]int32, error) {
	policy := preferDualStack
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.ServiceSpec{
			IPFamilyPolicy:        &policy,
			Type:                  corev1.ServiceTypeNodePort,
			ExternalTrafficPolicy: etp,
			Selector:              map[string]string{"app": "server"},
			Ports: []corev1.ServicePort{
				{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(80)},
				{Name: "udp", Protocol: corev1.ProtocolUDP, Port: 81, TargetPort: intstr.FromInt32(81)},
			},
		},
	}
	got, err := c.Core.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create service %s/%s: %w", ns, name, err)
	}
	out := map[int]int32{}
	for _, p := range got.Spec.Ports {
		if p.NodePort == 0 {
			return nil, fmt.Errorf("service %s/%s: port %d got no node port", ns, name, p.Port)
		}
		out[int(p.Port)] = p.NodePort
	}
	return out, nil
}

// createLoadBalancerService creates a Service of type LoadBalancer in front
// of the servers and waits until it has an ingress address (from
// tendril-operator's load-balancer IPAM and the lab's pool).
func createLoadBalancerService(ctx context.Context, c *k8s.Clients, ns, name string, wait time.Duration) (string, error) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.ServiceSpec{
			Type:                  corev1.ServiceTypeLoadBalancer,
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyCluster,
			Selector:              map[string]string{"app": "server"},
			Ports: []corev1.ServicePort{
				{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(80)},
			},
		},
	}
	if _, err := c.Core.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return "", fmt.Errorf("create service %s/%s: %w", ns, name, err)
	}
	deadline := time.Now().Add(wait)
	for {
		got, err := c.Core.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			for _, in := range got.Status.LoadBalancer.Ingress {
				if ip := net.ParseIP(in.IP); ip != nil && ip.To4() != nil {
					return in.IP, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("service %s/%s got no IPv4 load-balancer address within %s: does the lab run tendril-operator (lab up --operators 1) with its TendrilLoadBalancerIPPool %s?",
				ns, name, wait, lab.LBPoolName)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// waitEndpoints waits until the Service's EndpointSlices (made by the
// controller manager from its selector) list want ready endpoints.
func waitEndpoints(ctx context.Context, c *k8s.Clients, ns, name string, want int, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		slices, err := c.Core.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + name})
		ready := 0
		if err == nil {
			for _, sl := range slices.Items {
				for _, ep := range sl.Endpoints {
					if ep.Conditions.Ready == nil || *ep.Conditions.Ready {
						ready++
					}
				}
			}
			if ready >= want {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("service %s/%s: %d of %d endpoints ready after %s (last error: %v)", ns, name, ready, want, wait, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// ipv6Phase is the checks of a dual-stack cluster in IPv6: pods across
// the nodes, a Service's IPv6 ClusterIP, a pod's traffic to the world's
// IPv6 address masqueraded to its node's IPv6 address, and the world at a
// node port of a node's IPv6 address. It runs after the policies are
// deleted.
func ipv6Phase(cfg Config, ns string, ips6, clusterIPs6 map[string]string, clusterNodePorts map[int]int32) phase {
	from := func(pod string) string { return ns + "/" + pod }
	to := func(ip string, port int) string { return net.JoinHostPort(ip, strconv.Itoa(port)) }
	servers := []string{podServerSame, podServerOther}
	checks := []Check{
		check("IPv6 pod to pod, other node, TCP", from(podClient), to(ips6[podServerOther], 80), "tcp", true),
		check("IPv6 pod to pod, other node, UDP", from(podClient), to(ips6[podServerOther], 81), "udp", true),
		check("IPv6 pod to pod, other node, ICMPv6", from(podClient), ips6[podServerOther], "icmp", true),
		check("IPv6 pod to host, other node", from(podClient), cfg.NodeIPs6[1], "icmp", true),
		{Name: "IPv6 ClusterIP, other node, TCP, balances over both", From: from(podRemoteClient), To: to(clusterIPs6[svcServers], 80), Proto: "tcp",
			Allowed: true, Backends: servers, Repeat: spreadProbes, Spread: true},
		{Name: "IPv6 ClusterIP, other node, UDP", From: from(podRemoteClient), To: to(clusterIPs6[svcServers], 81), Proto: "udp",
			Allowed: true, Backends: servers},
	}
	if cfg.World6 != "" {
		checks = append(checks,
			Check{Name: "IPv6 pod to world leaves with node 1's IPv6 address, TCP", From: from(podClient), To: to(cfg.World6, 80), Proto: "tcp",
				Allowed: true, AnswerPrefix: "world from [" + cfg.NodeIPs6[0] + "]:"},
			Check{Name: "IPv6 pod to world leaves with node 2's IPv6 address, UDP", From: from(podRemoteClient), To: to(cfg.World6, 81), Proto: "udp",
				Allowed: true, AnswerPrefix: "world from [" + cfg.NodeIPs6[1] + "]:"},
			Check{Name: "IPv6 world to NodePort, externalTrafficPolicy Cluster, node 1, TCP: local and remote servers", From: lab.WorldRef,
				To: to(cfg.NodeIPs6[0], int(clusterNodePorts[80])), Proto: "tcp", Allowed: true, Backends: servers, Repeat: spreadProbes, Spread: true})
	}
	return phase{"IPv6 (dual stack): pods across nodes, ClusterIP, masquerade, NodePort from the world", nil, checks}
}
