package agent

import (
	"context"
	"log/slog"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"

	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/lifecycle"
)

// policyCell is the policy repository and its resolution per endpoint;
// its start step restores the rules imported through the API before the
// restart, so restored endpoints regenerate to exactly what they enforced.
var policyCell = cell.Module("policy", "Policy repository resolution and the policy file",
	cell.Provide(newPolicyModule),
	cell.Invoke(registerPolicyRestore),
)

type stepParams struct {
	cell.In

	Log       *slog.Logger
	Lifecycle cell.Lifecycle
	Steps     *lifecycle.Steps
	Jobs      job.Registry
	Health    *health.Registry
}

func registerPolicyRestore(p stepParams, pol *policyModule) {
	p.Steps.Append(p.Lifecycle, "policy-restore", pol.restorePolicy, nil)
	// The file's writer runs from after the restore until the step stops,
	// with the last change written.
	newJobGroup(p.Jobs, p.Health, "policy-restore", p.Log).Add(job.OneShot("policy-file", func(ctx context.Context, _ cell.Health) error {
		pol.file.Run(ctx)
		return nil
	}))
}

// regenerationCell is start step 9: the restored endpoints regenerate once
// identities and policy are in, then the endpoint manager's workers and the
// policy regeneration keep every endpoint at the current policy.
var regenerationCell = cell.Module("regeneration", "Endpoint regeneration after restore and on policy changes",
	cell.Invoke(registerRegeneration),
)

type regenerationParams struct {
	cell.In

	Endpoints *endpointsModule
	Policy    *policyModule
	Realizer  *endpointRealizer // nil without the datapath
}

func registerRegeneration(p stepParams, r regenerationParams) {
	eps := r.Endpoints
	p.Steps.Append(p.Lifecycle, "regenerate-restored", eps.regenerateRestored, nil)
	newJobGroup(p.Jobs, p.Health, "regenerate-restored", p.Log).Add(job.OneShot("regeneration-workers", eps.runWorkers))
	// The step marks where the policy regeneration starts (its job,
	// right after it).
	p.Steps.Append(p.Lifecycle, "policy-regeneration", nil, nil)
	var refresh func(*endpoint.Endpoint) error
	if r.Realizer != nil {
		refresh = r.Realizer.refreshPolicy
	}
	newJobGroup(p.Jobs, p.Health, "policy-regeneration", p.Log).Add(job.OneShot("policy-regeneration", func(ctx context.Context, _ cell.Health) error {
		r.Policy.run(ctx, refresh)
		return nil
	}))
}
