// Package kubelet is the lab's minimal kubelet, one process per lab node,
// running in the machine's network namespace: it proxies the API server
// (and the lab's kvstore, when it has one) into its node's namespace
// (where the node's tendril-agent runs), registers
// and heartbeats its Node, optionally schedules unbound pods round robin,
// and runs the pods bound to its node: a network namespace wired by
// tendril-cni, the built-in workload (package lab/workload) inside it, and
// the pod's status written once the workload listens.
package kubelet

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"

	"k8s.io/client-go/kubernetes"

	"github.com/tendril-net/tendril/pkg/controlplane"
	"github.com/tendril-net/tendril/pkg/lab"
)

// Config is one kubelet's job.
type Config struct {
	// Lab is the lab's state (lab.json).
	Lab *lab.State
	// Node is this kubelet's node.
	Node string
	// Schedule makes this kubelet also bind unscheduled pods to nodes
	// (one kubelet of the lab does it).
	Schedule bool
	Log      *slog.Logger
}

// Run serves until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	n, err := cfg.Lab.Node(cfg.Node)
	if err != nil {
		return err
	}
	log := cfg.Log.With("node", n.Name)
	if err := startProxies(ctx, cfg.Lab, n, log); err != nil {
		return err
	}

	rc, err := controlplane.RESTConfig(cfg.Lab.Kubeconfig)
	if err != nil {
		return err
	}
	rc.UserAgent = "tendril-lab-kubelet/" + n.Name
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	if err := registerNode(ctx, cs, cfg.Lab, n, log); err != nil {
		return err
	}
	go heartbeat(ctx, cs, n.Name, log)
	if cfg.Schedule {
		go runScheduler(ctx, cs, log.With("component", "scheduler"))
	}
	cni, err := newCNIRuntime(cfg.Lab.BinDir, n.CNICacheDir, lab.NetnsPath(n.Netns), n.Socket,
		filepath.Join(cfg.Lab.LogDir(), "cni-"+n.Name+".log"))
	if err != nil {
		return err
	}
	pm := newPodManager(cs, cfg.Lab, n, cni, log.With("component", "pods"))
	return pm.run(ctx)
}

// RunProxies serves only the node's proxies of the API server (and the
// kvstore) until ctx ends: for the lab's real nodes (lab up --runtime
// containerd), whose kubelet is the upstream one.
func RunProxies(ctx context.Context, cfg Config) error {
	n, err := cfg.Lab.Node(cfg.Node)
	if err != nil {
		return err
	}
	if err := startProxies(ctx, cfg.Lab, n, cfg.Log.With("node", n.Name)); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

// startProxies forwards, from inside the node's namespace, the API server
// (for the node's agent and kubelet at 127.0.0.1:NodeAPIPort, for pods at
// <node address>:<API port>) and the lab's kvstore to the machine's
// loopback.
func startProxies(ctx context.Context, st *lab.State, n *lab.Node, log *slog.Logger) error {
	ln, err := listenInNetns(lab.NetnsPath(n.Netns), "127.0.0.1:"+strconv.Itoa(lab.NodeAPIPort))
	if err != nil {
		return fmt.Errorf("API server proxy in %s: %w", n.Netns, err)
	}
	go proxyTCP(ctx, ln, "127.0.0.1:"+strconv.Itoa(st.APIPort), log.With("component", "api-proxy"))
	// Pods reach the API server at <node address>:<API port> (node1's is
	// the advertised endpoint of the kubernetes Service).
	podLn, err := listenInNetns(lab.NetnsPath(n.Netns), net.JoinHostPort(n.Address, strconv.Itoa(st.APIPort)))
	if err != nil {
		return fmt.Errorf("API server proxy for pods in %s: %w", n.Netns, err)
	}
	go proxyTCP(ctx, podLn, "127.0.0.1:"+strconv.Itoa(st.APIPort), log.With("component", "api-proxy-pods"))
	if st.KVStorePort != 0 {
		// The lab's kvstore etcd, for the node's agent (plain TCP, as the
		// API server's connections).
		kvLn, err := listenInNetns(lab.NetnsPath(n.Netns), "127.0.0.1:"+strconv.Itoa(lab.NodeKVStorePort))
		if err != nil {
			return fmt.Errorf("kvstore proxy in %s: %w", n.Netns, err)
		}
		go proxyTCP(ctx, kvLn, "127.0.0.1:"+strconv.Itoa(st.KVStorePort), log.With("component", "kvstore-proxy"))
	}
	return nil
}
