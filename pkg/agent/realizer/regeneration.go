package realizer

import (
	"context"
	"log/slog"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"

	"github.com/tendril-net/tendril/pkg/agent/agentendpoints"
	"github.com/tendril-net/tendril/pkg/agent/agentpolicy"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/lifecycle"
)

type stepParams struct {
	cell.In

	Log       *slog.Logger
	Lifecycle cell.Lifecycle
	Steps     *lifecycle.Steps
	Jobs      job.Registry
	Health    *health.Registry
}

// RegenerationCell is start step 9: the restored endpoints regenerate once
// identities and policy are in, then the endpoint manager's workers and the
// policy regeneration keep every endpoint at the current policy.
var RegenerationCell = cell.Module("regeneration", "Endpoint regeneration after restore and on policy changes",
	cell.Invoke(registerRegeneration),
)

type regenerationParams struct {
	cell.In

	Endpoints *agentendpoints.Module
	Policy    *agentpolicy.Module
	Realizer  *Realizer // nil without the datapath
}

func registerRegeneration(p stepParams, r regenerationParams) {
	eps := r.Endpoints
	p.Steps.Append(p.Lifecycle, "regenerate-restored", func(ctx context.Context) error {
		err := eps.RegenerateRestored(ctx)
		if r.Realizer != nil {
			// Every restored endpoint is in the endpoints table now
			// (regenerated, or as the previous run left it): the table's
			// reconciler may prune the attachments of the others.
			r.Realizer.MarkRestored()
		}
		return err
	}, nil)
	p.Jobs.NewGroup(p.Health.Scope("regenerate-restored"), job.WithLogger(p.Log)).Add(job.OneShot("regeneration-workers", eps.RunWorkers))
	// The step marks where the policy regeneration starts (its job,
	// right after it).
	p.Steps.Append(p.Lifecycle, "policy-regeneration", nil, nil)
	var refresh func(*endpoint.Endpoint) error
	if r.Realizer != nil {
		refresh = r.Realizer.RefreshPolicy
	}
	p.Jobs.NewGroup(p.Health.Scope("policy-regeneration"), job.WithLogger(p.Log)).Add(job.OneShot("policy-regeneration", func(ctx context.Context, _ cell.Health) error {
		r.Policy.Run(ctx, refresh)
		return nil
	}))
}
