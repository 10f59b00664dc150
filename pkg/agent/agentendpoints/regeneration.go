package agentendpoints

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"

	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/endpointmanager"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/lifecycle"
)

// Realizer is the datapath side of every endpoint's regeneration (package
// realizer). The endpoints call it and hand it what it needs; it never
// calls back. Nil without the datapath.
type Realizer interface {
	endpointmanager.Regenerator
	// Restored hands over the endpoints read back from disk, before any
	// of them regenerates.
	Restored(eps []*endpoint.Endpoint)
	// Revoked forgets the endpoints' references on an identity the
	// cluster no longer gives to their labels and names those endpoints:
	// the endpoints requeue them.
	Revoked(id identity.NumericIdentity) []uint16
	// MarkRestored says every restored endpoint regenerated (or was kept
	// as the previous run left it): what no endpoint backs may be pruned.
	MarkRestored()
	// RefreshPolicy is the light regeneration after a policy change.
	RefreshPolicy(ep *endpoint.Endpoint) error
}

// PolicyRegeneration is the policy's pass over every endpoint after a
// policy, identity or mode change (agentpolicy).
type PolicyRegeneration interface {
	Run(ctx context.Context, refresh func(*endpoint.Endpoint) error)
}

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
// policy regeneration keep every endpoint at the current policy. It makes
// the realizer the endpoints' regeneration hook, and requeues the
// endpoints whose identity is revoked.
var RegenerationCell = cell.Module("regeneration", "Endpoint regeneration after restore and on policy changes",
	cell.Provide(registerRegeneration),
)

type regenerationParams struct {
	cell.In

	Endpoints  *Module
	Policy     PolicyRegeneration
	Realizer   Realizer // nil without the datapath
	Identities identity.Allocator
}

func registerRegeneration(p stepParams, r regenerationParams) lifecycle.Invoked {
	eps := r.Endpoints
	if r.Realizer != nil {
		eps.setRealizer(r.Realizer)
		r.Identities.SubscribeRevoked(eps.identityRevoked)
	}
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
	return lifecycle.Invoked{}
}

// setRealizer makes r the last step of every endpoint's regeneration
// (after host networking) and the receiver of the restored endpoints.
func (m *Module) setRealizer(r Realizer) {
	m.AddRegenerateHook(r)
	m.hookMu.Lock()
	defer m.hookMu.Unlock()
	m.realizer = r
}

func (m *Module) realizerOrNil() Realizer {
	m.hookMu.Lock()
	defer m.hookMu.Unlock()
	return m.realizer
}

// identityRevoked requeues, at once, the endpoints whose identity the
// cluster gave to other labels: until they regenerate they keep a number
// that stands for someone else elsewhere.
func (m *Module) identityRevoked(id identity.NumericIdentity, _ []string) {
	r := m.realizerOrNil()
	if r == nil {
		return
	}
	for _, ep := range r.Revoked(id) {
		if mgr := m.mgr; mgr != nil {
			mgr.Requeue(ep, fmt.Sprintf("Identity %d no longer stands for its labels", id))
		}
	}
}
