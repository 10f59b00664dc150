package agent

import (
	"github.com/cilium/hive/cell"

	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/endpointmanager"
	"github.com/tendril-net/tendril/pkg/kvstore/agentkv"
)

// wiring gives the cells that live in their subsystem packages what they
// take from the agent's configuration and from cells still in this
// package, as the types those packages declare.
var wiring = cell.Provide(
	kvstoreConfig,
	kvstoreEndpoints,
	kvstoreNodeIP,
	kvstoreIPCache,
)

func kvstoreConfig(cfg Config) agentkv.Config {
	return agentkv.Config{Mode: cfg.KVStore, KVStore: cfg.KVStoreConfig, StateDir: cfg.StateDir, NodeName: cfg.NodeName,
		IdentityAllocationMode: cfg.IdentityAllocationMode}
}

// kvEndpoints reads the endpoint manager, which the endpoints' start step
// builds (before the kvstore's).
type kvEndpoints struct{ eps *endpointsModule }

func kvstoreEndpoints(eps *endpointsModule) agentkv.Endpoints { return kvEndpoints{eps} }

func (k kvEndpoints) Subscribe(fn func(endpointmanager.Event)) { k.eps.mgr.Subscribe(fn) }
func (k kvEndpoints) List() []*endpoint.Endpoint               { return k.eps.mgr.List() }
func (k kvEndpoints) Lookup(id string) (*endpoint.Endpoint, error) {
	return k.eps.mgr.Lookup(id)
}

func kvstoreNodeIP(k *kubernetesModule) agentkv.NodeIP {
	if k == nil {
		return nil
	}
	return k.nodeIP
}

// kvIPCache is the datapath's ipcache as the kvstore source writes it.
type kvIPCache struct{ *datapathModule }

func (c kvIPCache) AddInitializer(name string) func() { return c.ipcache.AddInitializer(name) }

func kvstoreIPCache(dp *datapathModule) agentkv.IPCache {
	if dp == nil {
		return nil
	}
	return kvIPCache{dp}
}
