package agent

import (
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"

	"github.com/tendril-net/tendril/pkg/dbinspect"
	"github.com/tendril-net/tendril/pkg/hubble/agentflows"
	"github.com/tendril-net/tendril/pkg/kvstore/agentkv"
	"github.com/tendril-net/tendril/pkg/loadbalancer/l2announcer"
)

// cells is the agent: one cell per subsystem. Each cell's constructor takes
// its dependencies as parameters and appends its start steps, so a step
// starts after the steps of what it depends on; where two steps do not
// depend on each other, the order of this list decides, and it is the
// seeds' order (docs/architecture.md, TestStartOrder):
//
//	config, k8s-client, bpf-maps, lb-restore, endpoint-restore-ipam, k8s-node-writeback,
//	k8s-watchers, kvstore, identity-restore, host-ips-ct-gc, policy-restore,
//	regenerate-restored, policy-regeneration, metrics, pprof, hubble, api-server
func cells(cfg Config, deps Deps) []cell.Cell {
	return []cell.Cell{
		job.Cell,
		wiring,
		l2Wiring,
		dbinspect.Cell, // statedb's cell and the tables' inspection
		coreCell(cfg, deps),
		kubernetesClientCell,
		datapathCell,
		masqueradeCell,
		servicesCell,
		endpointsCell,
		kubernetesCell,
		l2announcer.Cell,
		agentkv.Cell,
		realizerCell,
		hostIPsCell,
		policyCell,
		regenerationCell,
		ipcacheRestoredCell,
		agentflows.Cell,
		apiCell,
		serveCell,
	}
}
