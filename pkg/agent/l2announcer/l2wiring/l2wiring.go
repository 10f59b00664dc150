// Package l2wiring gives the L2 announcements' cell
// (pkg/agent/l2announcer) what it takes from the other cells: the host
// programs' devices, the Kubernetes client and
// the datapath's responder map. It keeps l2announcer free of the other
// cells' packages; the agent lists Cell instead of l2announcer.Cell.
package l2wiring

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/cilium/hive/cell"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tendril-net/tendril/pkg/agent/agentk8s"
	"github.com/tendril-net/tendril/pkg/agent/hostdev"
	"github.com/tendril-net/tendril/pkg/agent/l2announcer"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/k8s/watchers"
	"github.com/tendril-net/tendril/pkg/option"
)

// Cell is the L2 announcements' cell with its providers.
var Cell = cell.Group(
	cell.Provide(deviceNames, kube, cluster, responder, localNode),
	l2announcer.Cell,
)

// localNode is this node's name, the leases' holder identity.
func localNode(n option.LocalNode) l2announcer.Node { return l2announcer.Node{Name: n.Name} }

// deviceNames are the host programs' devices; nil without the datapath.
func deviceNames(m *hostdev.Masquerade) l2announcer.DeviceNames {
	if m == nil {
		return nil
	}
	return m.DeviceNames
}

// kube is the Kubernetes client once connected; nil in standalone mode.
func kube(k *agentk8s.Client) l2announcer.Kubernetes {
	if k == nil {
		return nil
	}
	return func() kubernetes.Interface { return k.Clients().Core }
}

// cluster follows the pools and the Nodes in the agent's watchers; nil
// in standalone mode.
func cluster(k *agentk8s.Client, node l2announcer.Node, log *slog.Logger) l2announcer.ClusterSource {
	if k == nil {
		return nil
	}
	return func(ctx context.Context) (func() l2announcer.Cluster, <-chan struct{}, error) {
		w := k.Watchers()
		if w == nil {
			return nil, nil, errors.New("not connected to Kubernetes")
		}
		changed := make(chan struct{}, 1)
		poke := func() {
			select {
			case changed <- struct{}{}:
			default:
			}
		}
		unPools, err := w.TendrilLoadBalancerIPPools.Subscribe(func(watchers.Event[*v1alpha1.TendrilLoadBalancerIPPool]) { poke() })
		if err != nil {
			return nil, nil, fmt.Errorf("follow %s: %w", v1alpha1.ResourceLoadBalancerIPPools, err)
		}
		unNodes, err := w.Nodes.Subscribe(func(watchers.Event[*corev1.Node]) { poke() })
		if err != nil {
			unPools()
			return nil, nil, fmt.Errorf("follow nodes: %w", err)
		}
		context.AfterFunc(ctx, func() { unPools(); unNodes() })
		bad := map[string]string{} // pool → the error last logged
		read := func() l2announcer.Cluster {
			var self map[string]string
			cl := l2announcer.Cluster{NodeAddrs: map[netip.Addr]string{}}
			for _, n := range w.Nodes.List() {
				if n.Name == node.Name {
					self = n.Labels
				}
				for _, a := range n.Status.Addresses {
					if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
						continue
					}
					if ip, err := netip.ParseAddr(a.Address); err == nil {
						cl.NodeAddrs[ip.Unmap()] = n.Name
					}
				}
			}
			for _, pool := range w.TendrilLoadBalancerIPPools.List() {
				p, err := l2announcer.ParsePolicy(pool, self)
				if err != nil {
					if bad[pool.Name] != err.Error() {
						log.Error("TendrilLoadBalancerIPPool's l2Announcements refused: none of its addresses is announced", "pool", pool.Name, "error", err)
						bad[pool.Name] = err.Error()
					}
					continue
				}
				delete(bad, pool.Name)
				if p != nil {
					cl.Policies = append(cl.Policies, p)
				}
			}
			return cl
		}
		return read, changed, nil
	}
}

// responder is the datapath's responder map; nil without the datapath.
func responder(l *loader.Loader) l2announcer.Responder {
	if l == nil {
		return nil
	}
	return loaderResponder{l}
}

// loaderResponder is the loader's responder map, looked up at each call:
// the maps are opened by the bpf-maps step, after the hive is built.
type loaderResponder struct{ l *loader.Loader }

func (r loaderResponder) Set(k maps.L2ResponderKey, e maps.L2ResponderEntry) error {
	return r.l.Maps().L2Responder().Set(k, e)
}

func (r loaderResponder) Delete(k maps.L2ResponderKey) error {
	return r.l.Maps().L2Responder().Delete(k)
}

func (r loaderResponder) List() (map[maps.L2ResponderKey]maps.L2ResponderEntry, error) {
	return r.l.Maps().L2Responder().List()
}
