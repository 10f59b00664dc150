// Package operator is the composition root of tendril-operator: a hive
// (github.com/cilium/hive) of the cells listed in Cells. Cluster-wide
// jobs (identity, endpoint and node garbage collection) register with the
// leader elector and run only on the replica holding the Lease. See
// docs/operator.md.
package operator

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"

	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/k8s"
	"github.com/tendril-net/tendril/pkg/kvstore"
	"github.com/tendril-net/tendril/pkg/operator/apiserver"
	"github.com/tendril-net/tendril/pkg/operator/clusterpool"
	"github.com/tendril-net/tendril/pkg/operator/endpointgc"
	"github.com/tendril-net/tendril/pkg/operator/identitygc"
	"github.com/tendril-net/tendril/pkg/operator/k8sclient"
	"github.com/tendril-net/tendril/pkg/operator/kvstoreclient"
	"github.com/tendril-net/tendril/pkg/operator/kvsync"
	"github.com/tendril-net/tendril/pkg/operator/lbipam"
	"github.com/tendril-net/tendril/pkg/operator/leader"
	"github.com/tendril-net/tendril/pkg/operator/nodegc"
	"github.com/tendril-net/tendril/pkg/operator/resources"
	"github.com/tendril-net/tendril/pkg/operator/status"
)

// Cells is the operator: infrastructure first, then the leader's jobs.
var Cells = []cell.Cell{
	job.Cell,
	cell.Provide(health.NewRegistry, newJobGroup),
	apiserver.Cell,
	k8sclient.Cell,
	kvstoreclient.Cell,
	resources.Cell,
	leader.Cell,
	status.Cell,
	identitygc.Cell,
	endpointgc.Cell,
	nodegc.Cell,
	clusterpool.Cell,
	lbipam.Cell,
	kvsync.Cell,
	cell.Invoke(registerChecks),
	// Last: the campaign starts once everything above has started.
	leader.CampaignCell,
}

// newJobGroup is the operator's one job group (the election and its
// term's jobs run under it).
func newJobGroup(jobs job.Registry, reg *health.Registry, log *slog.Logger) job.Group {
	return jobs.NewGroup(reg.Scope("operator"), job.WithLogger(log))
}

// registerChecks makes /healthz fail while the API server or the kvstore
// does not answer.
func registerChecks(s *apiserver.Server, clients *k8s.Clients, kv *kvstoreclient.Client) {
	s.AddCheck("kubernetes", func(ctx context.Context) error {
		body, err := clients.Core.Discovery().RESTClient().Get().AbsPath("/healthz").DoRaw(ctx)
		if err != nil {
			return fmt.Errorf("API server %s: %w", clients.REST.Host, err)
		}
		if string(body) != "ok" {
			return fmt.Errorf("API server %s: %s", clients.REST.Host, body)
		}
		return nil
	})
	if kv.Enabled() {
		s.AddCheck("kvstore", func(context.Context) error {
			c := kv.KV()
			if c == nil {
				return fmt.Errorf("not connected")
			}
			if st := c.Status(); st.State != kvstore.StateConnected {
				return fmt.Errorf("%s: %s", st.State, st.Message)
			}
			return nil
		})
	}
}

// New builds the operator's hive; extra cells come after the operator's
// own (tests reach objects through them).
func New(extra ...cell.Cell) *hive.Hive {
	opts := hive.DefaultOptions()
	opts.LogThreshold = time.Second
	return hive.NewWithOptions(opts, append(append([]cell.Cell{}, Cells...), extra...)...)
}
