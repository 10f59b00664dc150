// Package nodeids is the agent's cell for node IDs, after Cilium's: each
// other node of the nodes table gets a 16-bit ID, allocated by this
// agent, stable while the node stays and across the agent's restarts
// (saved in the state directory), served as GET /v1/node/ids
// (`cilium-dbg nodeid list`). IDs are this agent's own: two agents may
// give the same node different IDs, as in Cilium.
package nodeids

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/nodemanager"
	"github.com/tendril-net/tendril/pkg/option"
)

// Cell allocates the node IDs and serves them.
var Cell = cell.Module("node-ids", "IDs of the other nodes kept across restarts",
	cell.Provide(lifecycle.Build[*NodeIDs]),
	cell.Provide(New, apiHandlers),
)

// NodeIDs is the running allocation.
type NodeIDs struct {
	log   *slog.Logger
	dir   string
	db    *statedb.DB
	peers statedb.Table[*nodemanager.Peer]

	mu    sync.Mutex
	alloc *Allocator
	// dirty: the state file is behind the allocations (a save failed).
	dirty bool
	// passes counts the loop's passes (a test tells a quiet loop from a
	// spinning one by it).
	passes atomic.Uint64
}

type params struct {
	cell.In

	Agent  option.Agent
	Log    *slog.Logger
	DB     *statedb.DB
	Peers  statedb.Table[*nodemanager.Peer]
	Jobs   job.Registry
	Health *health.Registry
}

// New restores the saved allocations and adds the job that follows the
// nodes table.
func New(p params) *NodeIDs {
	n := &NodeIDs{log: p.Log, dir: p.Agent.StateDir, db: p.DB, peers: p.Peers, alloc: NewAllocator()}
	if c, err := n.alloc.Restore(n.dir); err != nil {
		// Starting over gives nodes new IDs; keeping a file that could
		// give two nodes one ID would be worse.
		n.log.Warn("Node IDs not restored; the nodes get new IDs", "error", err)
	} else if c > 0 {
		n.log.Info("Restored node IDs", "nodes", c)
	}
	jobs := p.Jobs.NewGroup(p.Health.Scope("node-ids"), job.WithLogger(p.Log))
	jobs.Add(job.OneShot("node-ids", n.run))
	return n
}

// saveRetry is how soon a failed save is tried again.
const saveRetry = 5 * time.Second

// run syncs the allocations at each change of the nodes table (and of its
// initialization) and saves them when they changed.
func (n *NodeIDs) run(ctx context.Context, h cell.Health) error {
	retry := time.NewTimer(saveRetry)
	defer retry.Stop()
	for {
		txn := n.db.ReadTxn()
		peers, changed := n.peers.AllWatch(txn)
		complete, initWatch := n.peers.Initialized(txn)
		if complete {
			// Initialized's channel is closed once the table is: waiting
			// on it spun this loop (an idle agent at 60-90% of a core).
			initWatch = nil
		}
		var nodes []Node
		for p := range peers {
			nodes = append(nodes, Node{Name: p.Name, IPs: p.IPs})
		}
		n.step(nodes, complete, h)
		n.passes.Add(1)
		if !n.dirty {
			retry.Stop()
		} else {
			retry.Reset(saveRetry)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-initWatch:
		case <-retry.C:
		}
	}
}

func (n *NodeIDs) step(nodes []Node, complete bool, h cell.Health) {
	n.mu.Lock()
	defer n.mu.Unlock()
	changed, err := n.alloc.Sync(nodes, complete)
	if err != nil {
		h.Degraded("allocate node IDs", err)
	}
	if changed || n.dirty {
		if err := n.alloc.Save(n.dir); err != nil {
			n.dirty = true
			h.Degraded("save node IDs", err)
			return
		}
		n.dirty = false
	}
	if err == nil {
		h.OK("node IDs allocated")
	}
}

// ID is a node's ID (false while it has none).
func (n *NodeIDs) ID(node string) (uint16, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.alloc.ID(node)
}

// apiHandlers serves GET /v1/node/ids as the Cilium v1 API defines it
// (an array of models.NodeID).
func apiHandlers(n *NodeIDs) server.HandlersOut {
	return server.Handlers(func(api *server.Server) {
		api.Handle(http.MethodGet, "/v1/node/ids", func(w http.ResponseWriter, _ *http.Request) error {
			n.mu.Lock()
			dump := n.alloc.Dump()
			n.mu.Unlock()
			server.WriteJSON(w, http.StatusOK, dump)
			return nil
		})
	})
}
