// Package k8senv runs a real Kubernetes control plane for tests: etcd and
// kube-apiserver (and, on request, kube-controller-manager) built by
// hack/k8s-binaries.sh, on loopback with generated certificates, in a
// temporary directory, as children of the test process. One control plane
// per test package (TestMain).
package k8senv

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tendril-net/tendril/pkg/controlplane"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// Options configure a control plane.
type Options struct {
	// ControllerManager also runs kube-controller-manager (EndpointSlices,
	// namespace deletion, service accounts and tokens, node CIDRs).
	ControllerManager bool
	// ClusterCIDR is the pod CIDR the node-IPAM controller splits into /24s.
	ClusterCIDR string
	// ServiceCIDR is the service network (empty: controlplane.ServiceCIDR).
	ServiceCIDR string
	// Log receives the processes' output (nil: discarded).
	Log io.Writer
}

// Env is a running control plane.
type Env struct {
	opts       Options
	spec       controlplane.Spec
	bin        string
	kubeconfig string
	restConfig *rest.Config
	clientset  kubernetes.Interface

	etcd, apiserver, cm *exec.Cmd
}

// Start runs a control plane and waits until the API server is ready.
func Start(ctx context.Context, opts Options) (*Env, error) {
	bin, err := controlplane.EnsureBinaries(opts.Log)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "tendril-k8senv-")
	if err != nil {
		return nil, err
	}
	e := &Env{opts: opts, bin: bin, spec: controlplane.Spec{Dir: dir, ControllerManager: opts.ControllerManager, ClusterCIDR: opts.ClusterCIDR, ServiceCIDR: opts.ServiceCIDR}}
	if err := e.start(ctx); err != nil {
		e.Stop()
		return nil, err
	}
	return e, nil
}

func (e *Env) start(ctx context.Context) error {
	var err error
	if e.spec.PKI, err = controlplane.NewPKI(e.spec.Dir, net.ParseIP(controlplane.KubernetesSvcIP), 24*time.Hour); err != nil {
		return err
	}
	if err := e.spec.AllocatePorts(); err != nil {
		return err
	}
	e.kubeconfig = filepath.Join(e.spec.Dir, "kubeconfig")
	if err := e.spec.WriteKubeconfig(e.kubeconfig, e.spec.APIServerURL(), "tendril-test"); err != nil {
		return err
	}
	if e.restConfig, err = controlplane.RESTConfig(e.kubeconfig); err != nil {
		return err
	}
	if e.clientset, err = kubernetes.NewForConfig(e.restConfig); err != nil {
		return err
	}
	e.etcd = e.command(controlplane.EtcdBinary, e.spec.EtcdArgs()...)
	if err := testutil.StartPinned(e.etcd); err != nil {
		return fmt.Errorf("start etcd: %w", err)
	}
	if err := controlplane.WaitTCP(ctx, "127.0.0.1:"+strconv.Itoa(e.spec.EtcdPort), 30*time.Second); err != nil {
		return err
	}
	if err := e.startAPIServer(ctx); err != nil {
		return err
	}
	if e.opts.ControllerManager {
		e.cm = e.command(controlplane.ControllerManagerBinary, e.spec.ControllerManagerArgs(e.kubeconfig)...)
		if err := testutil.StartPinned(e.cm); err != nil {
			return fmt.Errorf("start kube-controller-manager: %w", err)
		}
	}
	return nil
}

func (e *Env) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(e.bin, name), args...)
	if e.opts.Log != nil {
		cmd.Stdout, cmd.Stderr = e.opts.Log, e.opts.Log
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

func (e *Env) startAPIServer(ctx context.Context) error {
	e.apiserver = e.command(controlplane.APIServerBinary, e.spec.APIServerArgs()...)
	if err := testutil.StartPinned(e.apiserver); err != nil {
		return fmt.Errorf("start kube-apiserver: %w", err)
	}
	return controlplane.WaitReady(ctx, e.clientset, 90*time.Second, nil)
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

// EtcdURL is the client URL of the control plane's etcd (plain HTTP on
// loopback): a test may change what the API server will read at its next
// start while it is stopped (RestartAPIServer's down).
func (e *Env) EtcdURL() string { return e.spec.EtcdURL() }

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
	if e.spec.Dir != "" {
		_ = os.RemoveAll(e.spec.Dir)
	}
}
