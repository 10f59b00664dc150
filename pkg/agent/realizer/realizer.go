// Package realizer is the datapath side of an endpoint's regeneration
// (identity, ipcache, policy map entries, then the endpoint's object in
// the endpoints table, whose reconciler writes its endpoint map entry and
// attaches its programs: the "endpoint-realizer" cell, start step
// "identity-restore").
//
// The endpoint manager calls the realizer and hands it what it needs (the
// restored endpoints, the identities revoked); the realizer writes tables
// and waits on their reconcilers, and never calls back into the endpoints
// (agentendpoints's regeneration cell wires it in).
package realizer

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/cilium/hive/cell"

	"github.com/tendril-net/tendril/pkg/agent/agentdatapath"
	"github.com/tendril-net/tendril/pkg/agent/agentpolicy"
	"github.com/tendril-net/tendril/pkg/agent/epattach"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/ipcache"
	"github.com/tendril-net/tendril/pkg/lifecycle"
)

// Cell realizes endpoints in the datapath: it is the endpoint
// manager's regeneration step for identity, ipcache, policy map and
// programs, and its start step re-takes the restored endpoints' identities
// (step 7, after the kvstore, whose allocator must be synced first).
var Cell = cell.Module("endpoint-realizer", "Endpoint identity ipcache policy map and programs",
	// Invoke before Provide: one cycle check less (pkg/agent/cells.go).
	cell.Provide(lifecycle.Build[*Realizer]),
	cell.Provide(New),
)

// Realizer is the datapath side of an endpoint's regeneration;
// nil without the datapath.
type Realizer struct {
	log        *slog.Logger
	kernel     agentdatapath.Kernel
	attach     *epattach.Table
	ipcache    *ipcache.IPCache
	policy     *agentpolicy.Module
	identities identity.Allocator

	mu       sync.Mutex
	held     map[uint16]identity.NumericIdentity // identity reference held per endpoint
	restored []*endpoint.Endpoint                // what the endpoint manager read back from disk
}

// Params are the realizer's dependencies.
type Params struct {
	cell.In

	Log        *slog.Logger
	Lifecycle  cell.Lifecycle
	Steps      *lifecycle.Steps
	Kernel     agentdatapath.Kernel // nil without the datapath
	Attach     *epattach.Table      // the endpoints table; nil without the datapath
	IPCache    *ipcache.IPCache
	Policy     *agentpolicy.Module
	Identities identity.Allocator
}

// New builds the realizer (nil without the datapath) and appends its
// step. The endpoints make it their regeneration hook.
func New(p Params) *Realizer {
	if p.Kernel == nil {
		return nil
	}
	r := &Realizer{log: p.Log, kernel: p.Kernel, attach: p.Attach, ipcache: p.IPCache, policy: p.Policy, identities: p.Identities, held: map[uint16]identity.NumericIdentity{}}
	p.Steps.Append(p.Lifecycle, "identity-restore", func(context.Context) error {
		r.mu.Lock()
		restored := r.restored
		r.restored = nil
		r.mu.Unlock()
		r.reserveRestored(restored)
		// Before any regeneration: the endpoints table's prune must keep
		// every restored endpoint's attachment, regenerated or not.
		return r.keepRestored(restored)
	}, nil)
	return r
}

// Restored hands the realizer the endpoints the endpoint manager read back
// from disk (its start step, before the CNI server serves): the
// identity-restore step re-takes their identities and keeps their
// attachments.
func (m *Realizer) Restored(eps []*endpoint.Endpoint) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.restored = slices.Clone(eps)
}

// keepRestored puts the restored endpoints into the endpoints table as the
// previous run left them in the kernel (the reconciler writes nothing for
// them until their regeneration replaces them).
func (m *Realizer) keepRestored(eps []*endpoint.Endpoint) error {
	rows := make([]epattach.Endpoint, 0, len(eps))
	for _, ep := range eps {
		rows = append(rows, epattach.Endpoint{EndpointInfo: agentdatapath.EndpointInfo(ep), Namespace: ep.PodNamespace, Pod: ep.PodName})
	}
	if err := m.attach.AddRestored(rows); err != nil {
		return fmt.Errorf("keep the restored endpoints' attachments: %w", err)
	}
	return nil
}

// MarkRestored lets the endpoints table prune the attachments no endpoint
// backs: called once the restored endpoints have regenerated (each is in
// the table since the identity-restore step, regenerated or not).
func (m *Realizer) MarkRestored() { m.attach.MarkRestored() }

// Revoked forgets, for every endpoint holding id, that it holds it (the
// allocator dropped the references: nothing to release) and returns those
// endpoints: their next regeneration allocates their labels again. Until
// it runs, the endpoints keep the old number in the datapath; the number
// stands for other labels elsewhere already (that is why it was revoked),
// so the regeneration is queued at once.
func (m *Realizer) Revoked(id identity.NumericIdentity) []uint16 {
	m.mu.Lock()
	defer m.mu.Unlock()
	var eps []uint16
	for ep, held := range m.held {
		if held == id {
			delete(m.held, ep)
			eps = append(eps, ep)
		}
	}
	if len(eps) > 0 {
		m.log.Warn("Identity revoked; its endpoints allocate again", "identity", id, "endpoints", eps)
	}
	return eps
}

// reserveRestored re-takes the identities of restored endpoints so they
// keep the numbers their pinned policy entries use.
func (m *Realizer) reserveRestored(eps []*endpoint.Endpoint) {
	for _, ep := range eps {
		if ep.Identity == 0 || !identity.NumericIdentity(ep.Identity).IsCluster() {
			continue
		}
		labels := agentpolicy.EndpointLabels(ep)
		if err := m.identities.Reserve(identity.NumericIdentity(ep.Identity), labels); err != nil {
			m.log.Warn("Cannot keep a restored endpoint's identity; it gets a new one", "endpoint", ep.ID, "error", err)
			continue
		}
		m.mu.Lock()
		m.held[ep.ID] = identity.NumericIdentity(ep.Identity)
		m.mu.Unlock()
	}
}

// Regenerate realizes one endpoint in the datapath, in the order that keeps
// its first packet enforced: identity, ipcache, policy entries, then its
// object in the endpoints table, whose reconciler writes the endpoint map
// entry, then attaches the programs. It returns once that is done (an
// endpoint is ready only once attached), or with the attach's error (the
// endpoint manager retries the regeneration, and the reconciler the
// attach).
func (m *Realizer) Regenerate(ctx context.Context, ep *endpoint.Endpoint) error {
	labels := agentpolicy.EndpointLabels(ep)
	var id identity.NumericIdentity
	if len(labels) == 0 {
		id = identity.Init
	} else if agentpolicy.IsHealthEndpoint(ep) {
		// The node's health endpoint: the reserved identity, no allocation.
		id = identity.Health
	} else {
		m.mu.Lock()
		cur, held := m.held[ep.ID]
		m.mu.Unlock()
		if held {
			if ident, ok := m.identities.Lookup(cur); ok && identity.LabelsKey(ident.Labels) == identity.LabelsKey(labels) {
				id = cur
			}
		}
		if id == 0 {
			ident, _, err := m.identities.Allocate(labels)
			if err != nil {
				return fmt.Errorf("allocate identity: %w", err)
			}
			id = ident.ID
			m.mu.Lock()
			old, had := m.held[ep.ID]
			m.held[ep.ID] = id
			m.mu.Unlock()
			if had {
				_ = m.identities.Release(old)
			}
		}
	}
	ep.Identity = uint32(id)
	var prefixes []netip.Prefix
	for _, ip := range ep.Addresses() {
		e := ipcache.Entry{Identity: id, Source: ipcache.SourceLocal, Owner: ipcache.OwnerEndpoint(ep.ID), Name: ep.PodName, Namespace: ep.PodNamespace}
		p := netip.PrefixFrom(ip, ip.BitLen())
		if err := m.ipcache.Upsert(p, e); err != nil {
			return err
		}
		prefixes = append(prefixes, p)
	}
	// The endpoint is ready only once the ipcache's reconciler has written
	// its addresses to the map (a failed write fails the regeneration,
	// which is retried).
	if err := m.ipcache.WaitRealized(ctx, prefixes...); err != nil {
		return err
	}
	// The map state goes in before the endpoint's flags and programs, so the
	// first packet under enforcement already finds its rules.
	if err := m.policy.Realize(ctx, ep, m.kernel.PolicyMap()); err != nil {
		return err
	}
	ingress, egress := m.policy.Enforcement(ep)
	ep.EnforceIngress, ep.EnforceEgress = ingress, egress
	ep.AuditIngress, ep.AuditEgress = m.policy.Auditing(ep)
	ep.L7Ingress, ep.L7Egress = m.policy.Proxied(ep)
	if ep.HostIfIndex == 0 {
		return fmt.Errorf("endpoint %d has no host interface index", ep.ID)
	}
	if err := m.attach.Upsert(agentdatapath.EndpointInfo(ep), ep.PodNamespace, ep.PodName); err != nil {
		return err
	}
	if err := m.attach.WaitRealized(ctx, ep.ID); err != nil {
		return err
	}
	// Last: the flows the new policy revokes meet it on their next packet
	// only once its entries and the enforcement flags are in.
	_, err := m.policy.RevokeEstablished(ep)
	return err
}

// refreshWait bounds how long a policy refresh waits for the endpoints
// table's reconciler to write new flags (it has no context of its own):
// past it the refresh fails and the endpoint gets a full regeneration.
const refreshWait = time.Minute

// RefreshPolicy is the light regeneration after a policy, identity or mode
// change: the policy map difference, then the enforcement flags in the
// endpoint entries (only when they changed), then the end of the
// established flows the change revoked (--policy-revoke-established).
func (m *Realizer) RefreshPolicy(ep *endpoint.Endpoint) error {
	if err := m.policy.Realize(context.Background(), ep, m.kernel.PolicyMap()); err != nil {
		return err
	}
	ingress, egress := m.policy.Enforcement(ep)
	auditIn, auditEg := m.policy.Auditing(ep)
	l7In, l7Eg := m.policy.Proxied(ep)
	if ingress != ep.EnforceIngress || egress != ep.EnforceEgress || auditIn != ep.AuditIngress || auditEg != ep.AuditEgress ||
		l7In != ep.L7Ingress || l7Eg != ep.L7Egress {
		ep.EnforceIngress, ep.EnforceEgress = ingress, egress
		ep.AuditIngress, ep.AuditEgress = auditIn, auditEg
		ep.L7Ingress, ep.L7Egress = l7In, l7Eg
		if err := m.attach.Upsert(agentdatapath.EndpointInfo(ep), ep.PodNamespace, ep.PodName); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), refreshWait)
		defer cancel()
		if err := m.attach.WaitRealized(ctx, ep.ID); err != nil {
			return err
		}
	}
	// Last, as in a regeneration: entries and flags are in.
	_, err := m.policy.RevokeEstablished(ep)
	return err
}

// Remove tears an endpoint out of the datapath: its object leaves the
// endpoints table and the reconciler detaches it (Remove waits for that;
// a failed detach is returned and retried by the reconciler), then its
// ipcache claims and policy entries go.
func (m *Realizer) Remove(ctx context.Context, ep *endpoint.Endpoint) error {
	var errs []error
	if err := m.attach.Delete(ctx, ep.ID); err != nil {
		errs = append(errs, err)
	}
	for _, ip := range ep.Addresses() {
		if err := m.ipcache.Delete(netip.PrefixFrom(ip, ip.BitLen()), ipcache.SourceLocal, ipcache.OwnerEndpoint(ep.ID)); err != nil {
			errs = append(errs, err)
		}
	}
	if err := m.policy.Remove(ep, m.kernel.PolicyMap()); err != nil {
		errs = append(errs, err)
	}
	m.mu.Lock()
	id, held := m.held[ep.ID]
	delete(m.held, ep.ID)
	m.mu.Unlock()
	if held {
		_ = m.identities.Release(id)
	}
	if len(errs) > 0 {
		return fmt.Errorf("remove endpoint %d from the datapath: %v", ep.ID, errs)
	}
	return nil
}
