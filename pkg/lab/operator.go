package lab

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// ClusterPoolCIDR is the pool the lab's operators cut node CIDRs from
// with --ipam cluster-pool: apart from ClusterCIDR (which
// kube-controller-manager still splits into Node.spec.podCIDRs), so a
// pod address shows which IPAM gave it.
const ClusterPoolCIDR = "10.245.0.0/16"

// ClusterPoolCIDR6 is the IPv6 pool of a dual-stack lab (--ip-family
// dual), cut into a /64 per node (ClusterPoolMaskSize6), apart from
// ClusterCIDR6 as ClusterPoolCIDR is from ClusterCIDR.
const (
	ClusterPoolCIDR6     = "fd00:10:245::/56"
	ClusterPoolMaskSize6 = 64
)

// clusterPoolArgs are the cluster-pool options of the lab's operators
// and agents: the pools of the lab's families (the agents check their own
// CIDRs and their peers' against them and wait for a CIDR of each).
func clusterPoolArgs(st *State) []string {
	args := []string{"--cluster-pool-ipv4-cidr", ClusterPoolCIDR}
	if st.Dual() {
		args = append(args, "--cluster-pool-ipv6-cidr", ClusterPoolCIDR6)
	}
	return args
}

// operatorLease is the Lease tendril-operator elects its leader on.
const operatorLease = "tendril-operator-resource-lock"

// startOperators starts cfg.Operators tendril-operator replicas on the
// host (they reach the API server with the admin kubeconfig) and waits
// until one leads. With --ipam cluster-pool they allocate the nodes' pod
// CIDRs, and the agents get --ipam cluster-pool.
func startOperators(ctx context.Context, cfg Config, st *State, cs kubernetes.Interface, exited map[string]<-chan error, out io.Writer, start time.Time) error {
	if cfg.Operators == 0 {
		return nil
	}
	if _, err := os.Stat(filepath.Join(cfg.BinDir, "tendril-operator")); err != nil {
		return fmt.Errorf("tendril-operator not found in %s (make build, or --bin-dir)", cfg.BinDir)
	}
	for i := 1; i <= cfg.Operators; i++ {
		role := "operator-" + strconv.Itoa(i)
		apiAddr := "127.0.0.1:0"
		if st.Prometheus != nil {
			port, err := operatorMetricsPort(st, role)
			if err != nil {
				return err
			}
			apiAddr = "127.0.0.1:" + strconv.Itoa(port)
		}
		argv := []string{filepath.Join(st.BinDir, "tendril-operator"), "--kubeconfig", st.Kubeconfig,
			"--operator-id", st.Name + "-" + role, "--operator-api-serve-addr", apiAddr}
		if cfg.IPAM == "cluster-pool" {
			argv = append(argv, "--ipam", "cluster-pool", "--cluster-pool-ipv4-mask-size", "24")
			argv = append(argv, clusterPoolArgs(st)...)
			if st.Dual() {
				argv = append(argv, "--cluster-pool-ipv6-mask-size", strconv.Itoa(ClusterPoolMaskSize6))
			}
		}
		if st.KVStorePort != 0 {
			argv = append(argv, "--kvstore", "etcd", "--kvstore-endpoints", st.KVStoreURL(), "--identity-allocation-mode", "kvstore")
		}
		argv = append(argv, cfg.OperatorArgs...)
		cmd, _, err := StartDetached(st.PidDir(), role, filepath.Join(st.LogDir(), role+".log"), argv)
		if err != nil {
			return err
		}
		exited[role] = watchExit(cmd)
	}
	var leader string
	err := poll(ctx, "wait for a tendril-operator leader", 60*time.Second, st, exited, func() (bool, error) {
		l, err := cs.CoordinationV1().Leases("kube-system").Get(ctx, operatorLease, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
			return false, fmt.Errorf("lease %s has no holder", operatorLease)
		}
		leader = *l.Spec.HolderIdentity
		return true, nil
	})
	if err != nil {
		return err
	}
	step(out, start, "tendril-operator: %d replicas, leader %s", cfg.Operators, leader)
	if err := createLBPool(ctx, st); err != nil {
		return err
	}
	step(out, start, "load-balancer pool %s: %s, announced on the bridge (L2 announcements)", LBPoolName, LBPoolCIDR)
	return nil
}
