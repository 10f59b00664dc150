package agentservices

import (
	"net/netip"

	"github.com/tendril-net/tendril/pkg/agent/agentk8s"
)

// watchersOf are the Kubernetes client's watchers (they exist once its
// step has connected); nil in standalone mode.
func watchersOf(k *agentk8s.Client) Watchers {
	if k == nil {
		return nil
	}
	return k.Watchers
}

// PodPools are the cluster's pod address pools, from the Kubernetes
// options (--cluster-pool-ipv4-cidr, --cluster-pool-ipv6-cidr; empty when
// unset): no Service's external IP is taken inside them.
type PodPools []netip.Prefix

func podPoolsOf(c agentk8s.Config) PodPools { return c.ClusterPools() }
