package lab

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/tendril-net/tendril/pkg/controlplane"
)

// Cluster DNS: CoreDNS runs as lab pods in kube-system behind the kube-dns
// Service, as in a kubeadm cluster. Its pods are real endpoints (tendril-cni,
// identities, policy), so the agents' service load-balancing translates
// ClusterDNSIP to them like any other Service; nothing about DNS is special
// to the datapath. See docs/lab.md, "Cluster DNS".
const (
	// ClusterDNSIP is the kube-dns Service's ClusterIP: the tenth address
	// of controlplane.ServiceCIDR, as kubeadm picks it.
	ClusterDNSIP = "10.96.0.10"
	// ClusterDomain is the cluster's DNS domain.
	ClusterDomain = "cluster.local"
	// DNSNamespace, DNSServiceName and DNSAppLabel name the Service and
	// its pods as Kubernetes' own manifests do (k8s-app=kube-dns).
	DNSNamespace   = metav1.NamespaceSystem
	DNSServiceName = "kube-dns"
	DNSAppLabel    = "k8s-app"
	DNSAppValue    = "kube-dns"
	// CoreDNSImage marks a pod whose container the lab kubelet runs as
	// CoreDNS (State.CoreDNSBin with the container's args) instead of the
	// lab workload.
	CoreDNSImage = "tendril.io/lab-coredns"
	// CoreDNSVersion is what hack/coredns.sh builds.
	CoreDNSVersion = "v1.15.0"
	// CoreDNSReadyPort serves CoreDNS's ready plugin inside the pod: 200
	// once the kubernetes plugin has synced with the API server.
	CoreDNSReadyPort = 8181
	// dnsPodPrefix names the CoreDNS pods, one per node (coredns-node1...).
	dnsPodPrefix = "coredns-"
	// maxDNSPods bounds how many nodes get a CoreDNS pod.
	maxDNSPods = 2
)

// CoreDNSBinary is where hack/coredns.sh caches the CoreDNS binary.
func CoreDNSBinary() string {
	return filepath.Join(controlplane.BinaryDir(), "coredns-"+CoreDNSVersion)
}

// sourceRepoRoot is the repository this package was compiled from; it
// finds hack/coredns.sh when the binary is missing.
func sourceRepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// EnsureCoreDNS builds the CoreDNS binary with hack/coredns.sh (of the
// source tree this program was built from) when it is missing, and
// returns its path.
func EnsureCoreDNS(out io.Writer) (string, error) {
	bin := CoreDNSBinary()
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	script := filepath.Join(sourceRepoRoot(), "hack", "coredns.sh")
	if _, err := os.Stat(script); err != nil {
		return "", fmt.Errorf("%s missing, and no hack/coredns.sh to build it (run it from a Tendril checkout)", bin)
	}
	fmt.Fprintf(out, "==> building CoreDNS %s (hack/coredns.sh; minutes the first time)\n", CoreDNSVersion)
	cmd := exec.Command(script)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build CoreDNS (hack/coredns.sh): %w", err)
	}
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("hack/coredns.sh ran but left no %s", bin)
	}
	return bin, nil
}

// CoreDNSDir holds the Corefile and the kubeconfig CoreDNS reads.
func (s *State) CoreDNSDir() string { return filepath.Join(s.Dir, "coredns") }

// Corefile is the path of CoreDNS's configuration.
func (s *State) Corefile() string { return filepath.Join(s.CoreDNSDir(), "Corefile") }

// CoreDNSKubeconfig is the kubeconfig CoreDNS watches the API server with.
func (s *State) CoreDNSKubeconfig() string { return filepath.Join(s.CoreDNSDir(), "kubeconfig") }

// Corefile renders CoreDNS's configuration: the kubernetes plugin
// authoritative for the cluster domain and the reverse zones, watching the
// API server with kubeconfig; and the zone WorldZone, where WorldName
// answers the world server's address (the hosts plugin; every other name
// there gets SERVFAIL, the plugin having no SOA for an NXDOMAIN), so FQDN policy is tested against a real outside
// address by name. There is deliberately no forward plugin:
// the lab never sends traffic outside its own namespaces, so a name
// outside the cluster gets SERVFAIL rather than a query to the machine's
// resolver. No cache either: tests create a Service and resolve it at
// once, and a cached NXDOMAIN would hide it for its TTL. An empty
// kubeconfig makes the plugin go in-cluster (a real pod's token).
func Corefile(kubeconfig string) string {
	kc := ""
	if kubeconfig != "" {
		kc = "\n        kubeconfig " + kubeconfig
	}
	return fmt.Sprintf(`.:53 {
    errors
    health :8080
    ready :%d
    kubernetes %s in-addr.arpa ip6.arpa {%s
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }
    loadbalance
}
%s.:53 {
    errors
    hosts {
        %s %s
        ttl %d
    }
}
`, CoreDNSReadyPort, ClusterDomain, kc, WorldZone, WorldServerIP, WorldName, WorldNameTTL)
}

// WorldName is the world server's (WorldServerIP) name in the lab's DNS,
// in WorldZone, answered with WorldNameTTL.
const (
	WorldZone    = "example"
	WorldName    = "world." + WorldZone
	WorldNameTTL = 30
)

// writeCoreDNSConfig writes the Corefile and CoreDNS's kubeconfig. CoreDNS
// reaches the API server as a pod does: through the kubernetes Service
// (https://10.96.0.1:443), translated by its node's agent to the API
// server's advertised endpoint, so DNS working proves that path too.
func writeCoreDNSConfig(st *State, spec *controlplane.Spec) error {
	if err := os.MkdirAll(st.CoreDNSDir(), 0o755); err != nil {
		return err
	}
	if err := spec.WriteKubeconfig(st.CoreDNSKubeconfig(), "https://"+controlplane.KubernetesSvcIP+":443", "tendril-lab-"+st.Name); err != nil {
		return err
	}
	return writeFileAtomic(st.Corefile(), []byte(Corefile(st.CoreDNSKubeconfig())))
}

// ResolvConf is the resolv.conf of a pod in namespace, as the kubelet
// writes it for dnsPolicy ClusterFirst.
func ResolvConf(namespace string) string {
	return fmt.Sprintf("nameserver %s\nsearch %s.svc.%s svc.%s %s\noptions ndots:5\n",
		ClusterDNSIP, namespace, ClusterDomain, ClusterDomain, ClusterDomain)
}

// PodUsesClusterDNS says whether a pod resolves through the cluster DNS:
// dnsPolicy ClusterFirst (the default) does; Default (the node's resolver,
// which CoreDNS itself uses) and None do not.
func PodUsesClusterDNS(p *corev1.Pod) bool {
	switch p.Spec.DNSPolicy {
	case "", corev1.DNSClusterFirst, corev1.DNSClusterFirstWithHostNet:
		return true
	}
	return false
}

// dnsNodes are the nodes that get a CoreDNS pod: the first two, so a
// two-node lab has a DNS backend on each node.
func dnsNodes(st *State) []Node {
	return st.Nodes[:min(len(st.Nodes), maxDNSPods)]
}

// deployClusterDNS creates the kube-dns Service at ClusterDNSIP and a
// CoreDNS pod on each of the first nodes. The lab's controller manager
// runs no Deployment controller, so the lab makes the pods itself, bound
// to their nodes (as static pods would be); the EndpointSlice controller
// then lists them behind the Service once they are Ready.
func deployClusterDNS(ctx context.Context, cs kubernetes.Interface, st *State) error {
	labels := map[string]string{DNSAppLabel: DNSAppValue}
	if err := createKubeDNSService(ctx, cs); err != nil {
		return err
	}
	for _, n := range dnsNodes(st) {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: dnsPodPrefix + n.Name, Namespace: DNSNamespace, Labels: labels},
			Spec: corev1.PodSpec{
				NodeName: n.Name,
				// CoreDNS resolves nothing through itself.
				DNSPolicy: corev1.DNSDefault,
				Containers: []corev1.Container{{
					Name: "coredns", Image: CoreDNSImage,
					Args: []string{"-conf", st.Corefile()},
					Ports: []corev1.ContainerPort{
						{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP},
						{Name: "dns-tcp", ContainerPort: 53, Protocol: corev1.ProtocolTCP},
					},
				}},
			},
		}
		if _, err := cs.CoreV1().Pods(DNSNamespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create CoreDNS pod %s/%s: %w", DNSNamespace, pod.Name, err)
		}
	}
	return nil
}

// waitClusterDNS waits until every CoreDNS pod is Ready (its ready plugin
// answers, so it has synced with the API server through the kubernetes
// Service) and the kube-dns EndpointSlices list them all as ready.
func waitClusterDNS(ctx context.Context, cs kubernetes.Interface, st *State) error {
	want := len(dnsNodes(st))
	return poll(ctx, "wait for CoreDNS behind the kube-dns Service", 3*time.Minute, nil, nil, func() (bool, error) {
		slices, err := cs.DiscoveryV1().EndpointSlices(DNSNamespace).List(ctx, metav1.ListOptions{
			LabelSelector: discoveryv1.LabelServiceName + "=" + DNSServiceName})
		if err != nil {
			return false, err
		}
		ready := 0
		for _, sl := range slices.Items {
			for _, ep := range sl.Endpoints {
				if ep.Conditions.Ready != nil && *ep.Conditions.Ready {
					ready++
				}
			}
		}
		if ready < want {
			pods, err := cs.CoreV1().Pods(DNSNamespace).List(ctx, metav1.ListOptions{LabelSelector: DNSAppLabel + "=" + DNSAppValue})
			if err != nil {
				return false, err
			}
			var states []string
			for i := range pods.Items {
				p := &pods.Items[i]
				states = append(states, p.Name+" "+string(p.Status.Phase)+" ready="+strconv.FormatBool(PodReady(p)))
			}
			return false, fmt.Errorf("%d of %d kube-dns endpoints ready (pods: %s)", ready, want, strings.Join(states, ", "))
		}
		return true, nil
	})
}

// createKubeDNSService creates the kube-dns Service at ClusterDNSIP in
// front of the pods labelled k8s-app=kube-dns.
func createKubeDNSService(ctx context.Context, cs kubernetes.Interface) error {
	labels := map[string]string{DNSAppLabel: DNSAppValue}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: DNSServiceName, Namespace: DNSNamespace, Labels: map[string]string{
			DNSAppLabel: DNSAppValue, "kubernetes.io/name": "CoreDNS", "kubernetes.io/cluster-service": "true"}},
		Spec: corev1.ServiceSpec{
			ClusterIP: ClusterDNSIP,
			Selector:  labels,
			Ports: []corev1.ServicePort{
				{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(53)},
				{Name: "dns-tcp", Protocol: corev1.ProtocolTCP, Port: 53, TargetPort: intstr.FromInt32(53)},
			},
		},
	}
	if _, err := cs.CoreV1().Services(DNSNamespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create Service %s/%s at %s: %w", DNSNamespace, DNSServiceName, ClusterDNSIP, err)
	}
	return nil
}
