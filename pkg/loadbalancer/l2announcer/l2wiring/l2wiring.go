// Package l2wiring gives the L2 announcements' cell
// (pkg/loadbalancer/l2announcer) what it takes from the other cells: the
// services tables, the host programs' devices, the Kubernetes client and
// the datapath's responder map. It keeps l2announcer free of the other
// cells' packages; the agent lists Cell instead of l2announcer.Cell.
package l2wiring

import (
	"github.com/cilium/hive/cell"
	"k8s.io/client-go/kubernetes"

	"github.com/tendril-net/tendril/pkg/datapath/hostdev"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/k8s/agentk8s"
	"github.com/tendril-net/tendril/pkg/loadbalancer/agentservices"
	"github.com/tendril-net/tendril/pkg/loadbalancer/l2announcer"
)

// Cell is the L2 announcements' cell with its providers. Its config and
// node name come from the agent's configuration.
var Cell = cell.Group(
	cell.Provide(services, deviceNames, kube, responder),
	l2announcer.Cell,
)

func services(s *agentservices.Module) l2announcer.Services {
	t := s.Tables()
	return l2announcer.Services{Services: t.Services, Backends: t.Backends}
}

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
