package agent

import (
	"github.com/cilium/hive/cell"
	"k8s.io/client-go/kubernetes"

	"github.com/tendril-net/tendril/pkg/datapath/agentdatapath"
	"github.com/tendril-net/tendril/pkg/datapath/hostdev"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/k8s/agentk8s"
	"github.com/tendril-net/tendril/pkg/loadbalancer/agentservices"
	"github.com/tendril-net/tendril/pkg/loadbalancer/l2announcer"
)

// l2Wiring gives the L2 announcements' cell (pkg/loadbalancer/l2announcer)
// what it takes from the agent: its config, the node's name, the services
// tables, the host programs' devices, the Kubernetes client and the
// responder map.
var l2Wiring = cell.Provide(
	func(c Config) l2announcer.Config { return c.L2Announcements },
	func(c Config) l2announcer.Node { return l2announcer.Node{Name: c.NodeName} },
	func(s *agentservices.Module) l2announcer.Services {
		t := s.Tables()
		return l2announcer.Services{Services: t.Services, Backends: t.Backends}
	},
	func(m *hostdev.Masquerade) l2announcer.DeviceNames {
		if m == nil {
			return nil
		}
		return m.DeviceNames
	},
	func(k *agentk8s.Client) l2announcer.Kubernetes {
		if k == nil {
			return nil
		}
		return func() kubernetes.Interface { return k.Clients().Core }
	},
	func(dp *agentdatapath.Module) l2announcer.Responder {
		if dp == nil {
			return nil
		}
		return l2Responder{dp.Loader()}
	},
)

// l2Responder is the loader's responder map, looked up at each call: the
// maps are opened by the bpf-maps step, after the hive is built.
type l2Responder struct{ l *loader.Loader }

func (r l2Responder) Set(k maps.L2ResponderKey, e maps.L2ResponderEntry) error {
	return r.l.Maps().L2Responder().Set(k, e)
}

func (r l2Responder) Delete(k maps.L2ResponderKey) error { return r.l.Maps().L2Responder().Delete(k) }

func (r l2Responder) List() (map[maps.L2ResponderKey]maps.L2ResponderEntry, error) {
	return r.l.Maps().L2Responder().List()
}
