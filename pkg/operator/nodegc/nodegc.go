// Package nodegc deletes TendrilNodes whose Node is gone, on the leader,
// every --nodes-gc-interval. A TendrilNode found orphaned in one pass is
// deleted in the next if it is still orphaned then, after a live read of
// the Node (a node re-registering gets a pass of grace), with a delete
// preconditioned on the UID and resourceVersion seen.
package nodegc

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tendril-net/tendril/pkg/k8s"
	"github.com/tendril-net/tendril/pkg/operator/apiserver"
	"github.com/tendril-net/tendril/pkg/operator/leader"
	"github.com/tendril-net/tendril/pkg/operator/periodic"
	"github.com/tendril-net/tendril/pkg/operator/resources"
	"github.com/tendril-net/tendril/pkg/operator/status"
)

// Config of the node GC.
type Config struct {
	NodesGCInterval time.Duration
}

// DefaultConfig runs every 5 minutes (Cilium's default).
func DefaultConfig() Config { return Config{NodesGCInterval: 5 * time.Minute} }

// Flags registers the options.
func (c Config) Flags(fs *pflag.FlagSet) {
	fs.Duration("nodes-gc-interval", c.NodesGCInterval, "Interval between orphaned TendrilNode GC passes (0 disables it)")
}

// Result is what a pass did.
type Result struct {
	Nodes      int
	Candidates int
	Deleted    int
}

func (r Result) String() string {
	return fmt.Sprintf("%d TendrilNodes: %d deleted, %d orphaned (deleted next pass if still orphaned)", r.Nodes, r.Deleted, r.Candidates)
}

// Collector is the TendrilNode GC. Its candidates live for one term.
type Collector struct {
	log        *slog.Logger
	clients    *k8s.Clients
	res        *resources.Resources
	candidates map[types.UID]bool
	deleted    prometheus.Counter
}

// Cell registers the GC as a leader job.
var Cell = cell.Module("node-gc", "Orphaned TendrilNode garbage collection",
	cell.Config(DefaultConfig()),
	cell.Provide(newCollector),
	cell.Invoke(func(*Collector) {}),
)

type params struct {
	cell.In
	Config    Config
	Log       *slog.Logger
	Clients   *k8s.Clients
	Resources *resources.Resources
	Elector   *leader.Elector
	Reports   *status.Reports
	Server    *apiserver.Server
}

func newCollector(p params) *Collector {
	c := New(p.Log, p.Clients, p.Resources)
	p.Server.Registry.MustRegister(c.deleted)
	periodic.Job{
		Name: "node-gc", Interval: p.Config.NodesGCInterval, Log: c.log, Reports: p.Reports,
		Pass:      func(ctx context.Context) (string, error) { r, err := c.Pass(ctx); return r.String(), err },
		Failed:    "Node GC pass failed",
		StartTerm: func() { c.candidates = map[types.UID]bool{} }, // a new term starts afresh
	}.Register(p.Elector)
	return c
}

// New returns a collector.
func New(log *slog.Logger, clients *k8s.Clients, res *resources.Resources) *Collector {
	return &Collector{log: log, clients: clients, res: res, candidates: map[types.UID]bool{},
		deleted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tendril_operator_node_gc_deleted_total", Help: "TendrilNodes deleted because their Node is gone",
		})}
}

// Pass runs one collection.
func (c *Collector) Pass(ctx context.Context) (Result, error) {
	var r Result
	tns, err := c.res.TNodes.List(labels.Everything())
	if err != nil {
		return r, fmt.Errorf("list TendrilNodes: %w", err)
	}
	r.Nodes = len(tns)
	next := map[types.UID]bool{}
	for _, tn := range tns {
		if ctx.Err() != nil {
			return r, ctx.Err()
		}
		if _, err := c.res.Nodes.Get(tn.Name); err == nil {
			continue
		}
		_, err := c.clients.Core.CoreV1().Nodes().Get(ctx, tn.Name, metav1.GetOptions{})
		if err == nil {
			continue // the cache lags
		}
		if !apierrors.IsNotFound(err) {
			return r, fmt.Errorf("read node %s: %w", tn.Name, err)
		}
		if !c.candidates[tn.UID] {
			next[tn.UID] = true
			r.Candidates++
			continue
		}
		rv, uid := tn.ResourceVersion, tn.UID
		err = c.clients.Tendril.TendrilV1alpha1().TendrilNodes().Delete(ctx, tn.Name,
			metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv, UID: &uid}})
		switch {
		case err == nil:
			r.Deleted++
			c.deleted.Inc()
			c.log.Info("Deleted orphaned TendrilNode", "node", tn.Name)
		case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
			// changed meanwhile: judged again next pass
		default:
			return r, fmt.Errorf("delete TendrilNode %s: %w", tn.Name, err)
		}
	}
	c.candidates = next
	return r, nil
}
