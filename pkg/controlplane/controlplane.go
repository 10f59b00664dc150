// Package controlplane describes a Kubernetes control plane made of the
// binaries hack/k8s-binaries.sh builds (etcd, kube-apiserver,
// kube-controller-manager) listening on 127.0.0.1: where the binaries are,
// their certificates, their command lines, an admin kubeconfig and the
// readiness checks. Who runs the processes (tests as children, the lab as
// detached daemons) is up to the caller.
package controlplane

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/tendril-net/tendril/pkg/freeport"
)

// Versions of the binaries hack/k8s-binaries.sh builds.
const (
	KubernetesVersion = "v1.36.3"
	EtcdVersion       = "v3.6.16"
)

// Binary names in the cache directory.
const (
	EtcdBinary              = "etcd-" + EtcdVersion
	APIServerBinary         = "kube-apiserver-" + KubernetesVersion
	ControllerManagerBinary = "kube-controller-manager-" + KubernetesVersion
	KubectlBinary           = "kubectl-" + KubernetesVersion
)

// Service network of the control plane; the API server's certificate
// covers the first address (the kubernetes service).
const (
	ServiceCIDR      = "10.96.0.0/16"
	KubernetesSvcIP  = "10.96.0.1"
	advertiseAddress = "192.0.2.1"
)

// BinaryDir is where hack/k8s-binaries.sh puts the binaries:
// ${TENDRIL_CACHE:-~/.cache/tendril}/bin.
func BinaryDir() string {
	cache := os.Getenv("TENDRIL_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "tendril")
	}
	return filepath.Join(cache, "bin")
}

// sourceRepoRoot is the repository this package was compiled from; it
// finds hack/k8s-binaries.sh when the binaries are missing.
func sourceRepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// MissingBinaries lists the required binaries that are not in dir.
func MissingBinaries(dir string) []string {
	var missing []string
	for _, b := range []string{EtcdBinary, APIServerBinary, ControllerManagerBinary} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			missing = append(missing, b)
		}
	}
	return missing
}

// EnsureBinaries builds missing binaries with hack/k8s-binaries.sh (of the
// source tree this program was built from) and returns their directory.
func EnsureBinaries(log io.Writer) (string, error) {
	dir := BinaryDir()
	missing := MissingBinaries(dir)
	if len(missing) == 0 {
		return dir, nil
	}
	script := filepath.Join(sourceRepoRoot(), "hack", "k8s-binaries.sh")
	if _, err := os.Stat(script); err != nil {
		return "", fmt.Errorf("%s missing from %s, and no hack/k8s-binaries.sh to build them (run it from a Tendril checkout)", strings.Join(missing, ", "), dir)
	}
	cmd := exec.Command(script)
	if log != nil {
		cmd.Stdout, cmd.Stderr = log, log
	}
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build Kubernetes binaries (hack/k8s-binaries.sh): %w", err)
	}
	return dir, nil
}

// Spec is one control plane: its directory, ports and options.
type Spec struct {
	// Dir holds etcd's data; the certificates are in PKI.
	Dir string
	PKI *PKI
	// Ports on 127.0.0.1.
	EtcdPort, EtcdPeerPort, APIPort, ControllerManagerPort int
	// ControllerManager says kube-controller-manager runs: it turns the
	// ServiceAccount admission plugin on (the controller makes the default
	// ServiceAccounts that plugin insists on).
	ControllerManager bool
	// ClusterCIDR is what node IPAM splits into a /24 per node: one
	// prefix, or an IPv4 and an IPv6 one separated by a comma (dual
	// stack: each Node gets a pod CIDR of each family, the IPv6 one of
	// NodeCIDRMaskSizeIPv6 bits).
	ClusterCIDR string
	// NodeCIDRMaskSizeIPv6 is the IPv6 pod CIDR's size per node (0: 64).
	NodeCIDRMaskSizeIPv6 int
	// ExtraControllers are kube-controller-manager controllers to run
	// besides the default set (ControllerManagerArgs): a lab of real
	// kubelets needs the workload controllers (daemonset, deployment,
	// replicaset) and root-ca-cert-publisher (the kube-root-ca.crt
	// ConfigMap every service-account token volume projects).
	ExtraControllers []string
	// AdvertiseAddress is the address the API server publishes as the
	// kubernetes Service's endpoint (empty: a documentation address that
	// nothing contacts; validation refuses loopback). The lab sets a node
	// address where its kubelet forwards the API server, so pods reach it.
	AdvertiseAddress string
	// ServiceCIDR is the service network (empty: ServiceCIDR, a /16). It
	// must contain KubernetesSvcIP; a benchmark of 100,000 services needs
	// more than a /16. An IPv4 and an IPv6 prefix separated by a comma
	// make the services dual stack.
	ServiceCIDR string
}

func (s *Spec) serviceCIDR() string {
	if s.ServiceCIDR != "" {
		return s.ServiceCIDR
	}
	return ServiceCIDR
}

// AllocatePorts fills every zero port with a free one.
func (s *Spec) AllocatePorts() error {
	ports := []*int{&s.EtcdPort, &s.EtcdPeerPort, &s.APIPort, &s.ControllerManagerPort}
	var picked []int
	for _, p := range ports {
		if *p != 0 {
			picked = append(picked, *p)
		}
	}
	for _, p := range ports {
		if *p != 0 {
			continue
		}
		port, err := freeport.Loopback(picked...)
		if err != nil {
			return err
		}
		*p = port
		picked = append(picked, port)
	}
	return nil
}

// EtcdURL is etcd's client URL.
func (s *Spec) EtcdURL() string { return "http://127.0.0.1:" + strconv.Itoa(s.EtcdPort) }

// APIServerURL is the API server's URL.
func (s *Spec) APIServerURL() string { return "https://127.0.0.1:" + strconv.Itoa(s.APIPort) }

// EtcdArgs are etcd's flags.
func (s *Spec) EtcdArgs() []string {
	peer := "http://127.0.0.1:" + strconv.Itoa(s.EtcdPeerPort)
	return []string{"--name", "default", "--data-dir", filepath.Join(s.Dir, "etcd"),
		"--listen-client-urls", s.EtcdURL(), "--advertise-client-urls", s.EtcdURL(),
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "default=" + peer, "--log-level", "warn"}
}

// advertise is the advertise address: validation refuses loopback, so
// without one a documentation address nothing ever contacts stands in.
func (s *Spec) advertise() string {
	if s.AdvertiseAddress != "" {
		return s.AdvertiseAddress
	}
	return advertiseAddress
}

// APIServerArgs are kube-apiserver's flags.
func (s *Spec) APIServerArgs() []string {
	admission := "--disable-admission-plugins=ServiceAccount"
	if s.ControllerManager {
		admission = "--enable-admission-plugins=NamespaceLifecycle"
	}
	return []string{
		"--etcd-servers", s.EtcdURL(),
		"--bind-address", "127.0.0.1", "--secure-port", strconv.Itoa(s.APIPort),
		"--advertise-address", s.advertise(),
		"--tls-cert-file", s.PKI.ServingCert, "--tls-private-key-file", s.PKI.ServingKey,
		"--client-ca-file", s.PKI.CA,
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", s.PKI.SAPub, "--service-account-signing-key-file", s.PKI.SAKey,
		"--service-cluster-ip-range", s.serviceCIDR(),
		"--authorization-mode", "RBAC",
		"--allow-privileged=true",
		admission,
	}
}

// ControllerManagerArgs are kube-controller-manager's flags: the
// EndpointSlice, namespace, service-account, token, node-IPAM and
// garbage-collector controllers (and ExtraControllers), authenticating
// with kubeconfig.
func (s *Spec) ControllerManagerArgs(kubeconfig string) []string {
	cidr := s.ClusterCIDR
	if cidr == "" {
		cidr = "10.244.0.0/16"
	}
	masks := []string{"--node-cidr-mask-size", "24"}
	if strings.Contains(cidr, ",") {
		v6 := s.NodeCIDRMaskSizeIPv6
		if v6 == 0 {
			v6 = 64
		}
		masks = []string{"--node-cidr-mask-size-ipv4", "24", "--node-cidr-mask-size-ipv6", strconv.Itoa(v6)}
	}
	return append([]string{
		"--kubeconfig", kubeconfig, "--authentication-kubeconfig", kubeconfig, "--authorization-kubeconfig", kubeconfig,
		"--controllers", strings.Join(append([]string{"endpointslice", "namespace", "serviceaccount", "serviceaccount-token", "nodeipam", "garbagecollector"}, s.ExtraControllers...), ","),
		"--allocate-node-cidrs=true", "--cluster-cidr", cidr,
		"--service-cluster-ip-range", s.serviceCIDR(),
		"--service-account-private-key-file", s.PKI.SAKey, "--root-ca-file", s.PKI.CA,
		"--leader-elect=false", "--bind-address", "127.0.0.1", "--secure-port", strconv.Itoa(s.ControllerManagerPort),
		"--use-service-account-credentials=false",
	}, masks...)
}

// WriteKubeconfig writes an admin kubeconfig for server (the API server's
// URL as seen by its user) to path.
func (s *Spec) WriteKubeconfig(path, server, name string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[name] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: s.PKI.CAPEM}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: s.PKI.AdminCertPEM, ClientKeyData: s.PKI.AdminKeyPEM}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: "admin"}
	cfg.CurrentContext = name
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	return nil
}

// RESTConfig loads a kubeconfig with a rate limit fit for tests and tools.
func RESTConfig(kubeconfig string) (*rest.Config, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig %s: %w", kubeconfig, err)
	}
	rc.QPS, rc.Burst = 500, 1000
	return rc, nil
}

// WaitTCP waits until something accepts connections on addr.
func WaitTCP(ctx context.Context, addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("nothing listens on %s: %w", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// WaitReady polls the API server's /readyz until it answers ok; the
// timeout only bounds a broken server. exited, when not nil, reports the
// process' early death.
func WaitReady(ctx context.Context, cs kubernetes.Interface, timeout time.Duration, exited func() error) error {
	deadline := time.Now().Add(timeout)
	var lastErr error
	for time.Now().Before(deadline) && ctx.Err() == nil {
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && strings.TrimSpace(string(body)) == "ok" {
			return nil
		}
		lastErr = err
		if exited != nil {
			if err := exited(); err != nil {
				return fmt.Errorf("kube-apiserver exited: %w", err)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("kube-apiserver not ready after %s: %v", timeout, lastErr)
}
