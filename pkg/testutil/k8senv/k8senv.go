// Package k8senv runs a real Kubernetes control plane for tests: etcd and
// kube-apiserver (and, on request, kube-controller-manager) built by
// hack/k8s-binaries.sh, on loopback with generated certificates, in a
// temporary directory. One control plane per test package (TestMain).
package k8senv

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
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Versions of the binaries hack/k8s-binaries.sh builds.
const (
	KubernetesVersion = "v1.36.3"
	EtcdVersion       = "v3.6.16"
)

// Options configure a control plane.
type Options struct {
	// ControllerManager also runs kube-controller-manager (EndpointSlices,
	// namespace deletion, service accounts and tokens, node CIDRs).
	ControllerManager bool
	// ClusterCIDR is the pod CIDR the node-IPAM controller splits into /24s.
	ClusterCIDR string
	// Log receives the processes' output (nil: discarded).
	Log io.Writer
}

// Env is a running control plane.
type Env struct {
	opts       Options
	dir        string
	bin        string
	pki        *pki
	etcdURL    string
	apiPort    int
	kubeconfig string
	restConfig *rest.Config
	clientset  kubernetes.Interface

	etcd, apiserver, cm *exec.Cmd
}

// BinaryDir is where hack/k8s-binaries.sh puts the binaries.
func BinaryDir() string {
	cache := os.Getenv("TENDRIL_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "tendril")
	}
	return filepath.Join(cache, "bin")
}

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", ".."))
}

// EnsureBinaries builds missing binaries with hack/k8s-binaries.sh.
func EnsureBinaries(log io.Writer) (string, error) {
	dir := BinaryDir()
	missing := false
	for _, b := range []string{"etcd-" + EtcdVersion, "kube-apiserver-" + KubernetesVersion, "kube-controller-manager-" + KubernetesVersion} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			missing = true
		}
	}
	if !missing {
		return dir, nil
	}
	cmd := exec.Command(filepath.Join(repoRoot(), "hack", "k8s-binaries.sh"))
	if log != nil {
		cmd.Stdout, cmd.Stderr = log, log
	}
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build Kubernetes binaries (hack/k8s-binaries.sh): %w", err)
	}
	return dir, nil
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// Start runs a control plane and waits until the API server is ready.
func Start(ctx context.Context, opts Options) (*Env, error) {
	bin, err := EnsureBinaries(opts.Log)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "tendril-k8senv-")
	if err != nil {
		return nil, err
	}
	e := &Env{opts: opts, dir: dir, bin: bin}
	if e.pki, err = newPKI(dir, net.ParseIP("10.96.0.1")); err != nil {
		e.Stop()
		return nil, err
	}
	if err := e.startEtcd(ctx); err != nil {
		e.Stop()
		return nil, err
	}
	if e.apiPort, err = freePort(); err != nil {
		e.Stop()
		return nil, err
	}
	if err := e.writeKubeconfig(); err != nil {
		e.Stop()
		return nil, err
	}
	if err := e.startAPIServer(ctx); err != nil {
		e.Stop()
		return nil, err
	}
	if opts.ControllerManager {
		if err := e.startControllerManager(); err != nil {
			e.Stop()
			return nil, err
		}
	}
	return e, nil
}

func (e *Env) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(e.bin, name), args...)
	if e.opts.Log != nil {
		cmd.Stdout, cmd.Stderr = e.opts.Log, e.opts.Log
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

func (e *Env) startEtcd(ctx context.Context) error {
	client, err := freePort()
	if err != nil {
		return err
	}
	peer, err := freePort()
	if err != nil {
		return err
	}
	e.etcdURL = "http://127.0.0.1:" + strconv.Itoa(client)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peer)
	e.etcd = e.command("etcd-"+EtcdVersion, "--name", "default", "--data-dir", filepath.Join(e.dir, "etcd"),
		"--listen-client-urls", e.etcdURL, "--advertise-client-urls", e.etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "default="+peerURL, "--log-level", "warn")
	if err := e.etcd.Start(); err != nil {
		return fmt.Errorf("start etcd: %w", err)
	}
	return waitTCP(ctx, "127.0.0.1:"+strconv.Itoa(client), 30*time.Second)
}

func waitTCP(ctx context.Context, addr string, timeout time.Duration) error {
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

func (e *Env) apiServerArgs() []string {
	admission := "--disable-admission-plugins=ServiceAccount"
	if e.opts.ControllerManager {
		admission = "--enable-admission-plugins=NamespaceLifecycle"
	}
	return []string{
		"--etcd-servers", e.etcdURL,
		"--bind-address", "127.0.0.1", "--secure-port", strconv.Itoa(e.apiPort),
		// Validation refuses a loopback advertise address: a documentation
		// address nothing ever contacts stands in.
		"--advertise-address", "192.0.2.1",
		"--tls-cert-file", e.pki.ServingCert, "--tls-private-key-file", e.pki.ServingKey,
		"--client-ca-file", e.pki.CA,
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", e.pki.SAPub, "--service-account-signing-key-file", e.pki.SAKey,
		"--service-cluster-ip-range", "10.96.0.0/16",
		"--authorization-mode", "RBAC",
		"--allow-privileged=true",
		admission,
	}
}

func (e *Env) startAPIServer(ctx context.Context) error {
	e.apiserver = e.command("kube-apiserver-"+KubernetesVersion, e.apiServerArgs()...)
	if err := e.apiserver.Start(); err != nil {
		return fmt.Errorf("start kube-apiserver: %w", err)
	}
	return e.waitReady(ctx, 90*time.Second)
}

// waitReady polls /readyz (the deadline only bounds a broken server).
func (e *Env) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var lastErr error
	for time.Now().Before(deadline) && ctx.Err() == nil {
		body, err := e.clientset.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && strings.TrimSpace(string(body)) == "ok" {
			return nil
		}
		lastErr = err
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("kube-apiserver not ready: %v", lastErr)
}

func (e *Env) writeKubeconfig() error {
	server := "https://127.0.0.1:" + strconv.Itoa(e.apiPort)
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["tendril-test"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: e.pki.caPEM}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: e.pki.adminCertPEM, ClientKeyData: e.pki.adminKeyPEM}
	cfg.Contexts["tendril-test"] = &clientcmdapi.Context{Cluster: "tendril-test", AuthInfo: "admin"}
	cfg.CurrentContext = "tendril-test"
	e.kubeconfig = filepath.Join(e.dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, e.kubeconfig); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", e.kubeconfig)
	if err != nil {
		return err
	}
	rc.QPS, rc.Burst = 500, 1000
	e.restConfig = rc
	e.clientset, err = kubernetes.NewForConfig(rc)
	return err
}

func (e *Env) startControllerManager() error {
	cidr := e.opts.ClusterCIDR
	if cidr == "" {
		cidr = "10.244.0.0/16"
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	e.cm = e.command("kube-controller-manager-"+KubernetesVersion,
		"--kubeconfig", e.kubeconfig, "--authentication-kubeconfig", e.kubeconfig, "--authorization-kubeconfig", e.kubeconfig,
		"--controllers", "endpointslice,namespace,serviceaccount,serviceaccount-token,nodeipam,garbagecollector",
		"--allocate-node-cidrs=true", "--cluster-cidr", cidr, "--node-cidr-mask-size", "24",
		"--service-cluster-ip-range", "10.96.0.0/16",
		"--service-account-private-key-file", e.pki.SAKey, "--root-ca-file", e.pki.CA,
		"--leader-elect=false", "--bind-address", "127.0.0.1", "--secure-port", strconv.Itoa(port),
		"--use-service-account-credentials=false")
	if err := e.cm.Start(); err != nil {
		return fmt.Errorf("start kube-controller-manager: %w", err)
	}
	return nil
}

// RestartAPIServer stops the API server and starts it again on the same
// port (for tests of retries through an outage). down is called while it
// is stopped.
func (e *Env) RestartAPIServer(ctx context.Context, down func()) error {
	stopProcess(e.apiserver)
	if down != nil {
		down()
	}
	return e.startAPIServer(ctx)
}

// Kubeconfig is the admin kubeconfig's path.
func (e *Env) Kubeconfig() string { return e.kubeconfig }

// RESTConfig is the admin REST config.
func (e *Env) RESTConfig() *rest.Config { return rest.CopyConfig(e.restConfig) }

// Clientset is an admin clientset.
func (e *Env) Clientset() kubernetes.Interface { return e.clientset }

func stopProcess(cmd *exec.Cmd) {
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// Stop stops every process and removes the directory.
func (e *Env) Stop() {
	stopProcess(e.cm)
	stopProcess(e.apiserver)
	stopProcess(e.etcd)
	if e.dir != "" {
		_ = os.RemoveAll(e.dir)
	}
}
