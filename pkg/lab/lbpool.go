package lab

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/controlplane"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	tendrilclient "github.com/tendril-net/tendril/pkg/k8s/client/clientset/versioned"
)

// The load-balancer addresses of the lab: a TendrilLoadBalancerIPPool on
// the lab bridge's subnet that no node uses (nodes are .11 up to .210),
// from which tendril-operator gives LoadBalancer Services their address;
// the pool opts its addresses in to L2 announcements (spec.l2Announcements,
// load-balancer addresses only: not external IPs), so the agents
// (--enable-l2-announcements) answer ARP for each address from one
// elected node, and the world reaches it on-link, with no route.
const (
	LBPoolName = "lab-bridge"
	LBPoolCIDR = NodeSubnetPrefix + "240/28"
)

// createLBPool creates the lab's pool (the operators have installed the
// CRDs by the time one leads).
func createLBPool(ctx context.Context, st *State) error {
	rc, err := controlplane.RESTConfig(st.Kubeconfig)
	if err != nil {
		return err
	}
	tc, err := tendrilclient.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("tendril client: %w", err)
	}
	pool := &v1alpha1.TendrilLoadBalancerIPPool{
		ObjectMeta: metav1.ObjectMeta{Name: LBPoolName},
		Spec: v1alpha1.LoadBalancerIPPoolSpec{Blocks: []v1alpha1.LoadBalancerIPBlock{{CIDR: LBPoolCIDR}},
			L2Announcements: &v1alpha1.L2AnnouncementPolicy{}},
	}
	if _, err := tc.TendrilV1alpha1().TendrilLoadBalancerIPPools().Create(ctx, pool, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create TendrilLoadBalancerIPPool %s (%s): %w", LBPoolName, LBPoolCIDR, err)
	}
	return nil
}
