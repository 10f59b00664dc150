package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/cilium/hive/cell"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/endpointmanager"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/identity/identitytable"
	"github.com/tendril-net/tendril/pkg/ipcache"
	"github.com/tendril-net/tendril/pkg/metrics"
	"github.com/tendril-net/tendril/pkg/option"
	"github.com/tendril-net/tendril/pkg/policy"
	"github.com/tendril-net/tendril/pkg/policy/policyfile"
)

// policyModule resolves the repository's rules for each endpoint and
// realizes the difference in the BPF policy map.
type policyModule struct {
	log        *slog.Logger
	repo       *policy.Repository
	runtime    *option.Runtime
	identities identity.Allocator
	idTable    *identitytable.Table // the universe's identities: one snapshot, a generation per change of the set or labels
	dp         *datapathModule      // nil without the datapath
	eps        *endpointsModule     // its manager exists from its start step on
	k8s        *k8sClient           // nil in standalone mode

	mu       sync.Mutex
	realized map[uint16]policy.MapState
	results  map[uint16]policy.Result
	cidrIDs  map[netip.Prefix]identity.NumericIdentity
	nextCIDR identity.NumericIdentity
	cidrGen  uint64
	cache    *policy.SelectorCache

	// universeEpoch moves whenever something outside the identity
	// allocator and the CIDR identities may have changed the universe (the
	// named ports of local and remote pods): every trigger and every
	// endpoint change.
	universeEpoch atomic.Uint64
	// sharedMu guards shared: the universe and the resolutions of the
	// current policy revision, shared by every endpoint that resolves alike.
	sharedMu sync.Mutex
	shared   *sharedResolution

	regen chan struct{}

	// file keeps the rules imported through the API across restarts;
	// its writer is a job started after restorePolicy.
	file *policyfile.File
}

// sharedResolution is what resolving one endpoint computes that does not
// depend on the endpoint: the universe (every identity, with named ports),
// built once per universe version, and the results per endpoint label set
// and named ports, computed once per policy revision. Without it a pass
// over N endpoints rebuilt the universe N times (each time listing every
// identity and every local endpoint): quadratic in the endpoints.
type sharedResolution struct {
	key      universeKey
	version  uint64 // the selector cache's version of this universe
	universe policy.Universe
	revision uint64
	// results are shared: their map states are never changed after
	// resolution.
	results map[string]policy.Result
}

// universeKey identifies a universe: it changes whenever one of its inputs
// does.
type universeKey struct {
	identities, cidr, epoch uint64
}

type policyParams struct {
	cell.In

	Config     Config
	Log        *slog.Logger
	Root       cell.RootLogger
	Runtime    *option.Runtime
	Identities identity.Allocator
	IDTable    *identitytable.Table
	Datapath   *datapathModule
	Endpoints  *endpointsModule
	K8s        *k8sClient
	Metrics    *metrics.Server
}

func newPolicyModule(p policyParams) *policyModule {
	m := &policyModule{
		log: p.Log, repo: policy.NewRepository(), runtime: p.Runtime, identities: p.Identities, idTable: p.IDTable,
		dp: p.Datapath, eps: p.Endpoints, k8s: p.K8s,
		realized: map[uint16]policy.MapState{}, results: map[uint16]policy.Result{},
		cidrIDs: map[netip.Prefix]identity.NumericIdentity{}, nextCIDR: 1, cache: policy.NewSelectorCache(),
		regen: make(chan struct{}, 1),
	}
	if m.dp != nil {
		p.Metrics.Registry.MustRegister(newAuditCollector(m))
	}
	m.file = policyfile.New(policyFile(p.Config), m.repo, policySourceAPI, logFor(p.Root, "policy-file"))
	m.repo.Subscribe(func(uint64) { m.triggerRegeneration() })
	if m.dp != nil {
		// A new or vanished identity may change what other endpoints'
		// selectors select.
		m.identities.Subscribe(func(_, _ []identity.Identity) {
			if rules, _ := m.repo.Rules(nil); len(rules) > 0 {
				m.triggerRegeneration()
			}
		})
	}
	m.runtime.Subscribe(func(option.RuntimeValues) { m.triggerRegeneration() })
	// An endpoint's identity is part of the universe (its pod's named
	// ports).
	m.eps.Subscribe(func(endpointmanager.Event) { m.invalidateUniverse() })
	return m
}

// triggerRegeneration asks for a policy pass over every endpoint; requests
// that arrive while one is pending fold into it. It never blocks: watcher
// callbacks call it.
func (p *policyModule) triggerRegeneration() {
	p.invalidateUniverse()
	select {
	case p.regen <- struct{}{}:
	default:
	}
}

// invalidateUniverse makes the next resolution rebuild the universe (named
// ports of pods may have changed).
func (p *policyModule) invalidateUniverse() { p.universeEpoch.Add(1) }

// run applies rule, identity and enforcement mode changes to every
// endpoint. It announces the repository's revision to the endpoint manager
// (each endpoint's desired revision), then refreshes the ready endpoints;
// those that are not ready, or whose refresh fails, are regenerated by the
// manager's workers, retried until they realize the revision.
//
// refresh is the light regeneration of one endpoint (nil without the
// datapath: there is nothing to refresh).
func (p *policyModule) run(ctx context.Context, refresh func(*endpoint.Endpoint) error) {
	if err := p.clearAuditCounts(); err != nil {
		p.log.Warn("Clear the audit counters of a previous run", "error", err)
	}
	if mgr := p.eps.mgr; mgr != nil && refresh != nil {
		mgr.SetPolicyRevision(p.repo.Revision())
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.regen:
		}
		if err := p.syncCIDRIdentities(); err != nil {
			p.log.Error("CIDR identities", "error", err)
		}
		// A deny naming a block must find the block's prefixes in the
		// datapath when the endpoints' entries for them land.
		if p.dp != nil && p.dp.loader.Maps() != nil {
			wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			if err := p.dp.policyCIDR.Synced(wctx); err != nil {
				p.log.Warn("Policy CIDR map not yet written; endpoints are regenerated anyway", "error", err)
			}
			cancel()
		}
		mgr := p.eps.mgr
		if mgr == nil || refresh == nil {
			continue
		}
		rev := p.repo.Revision()
		mgr.SetPolicyRevision(rev)
		start := time.Now()
		eps := mgr.List()
		failed := 0
		for _, ep := range eps {
			if err := mgr.Refresh(ctx, ep.ID, refresh); err != nil {
				failed++
				p.log.Warn("Apply a policy change to an endpoint; it is regenerated until it succeeds", "endpoint", ep.ID, "revision", rev, "error", err)
			}
		}
		p.log.Debug("Applied policy to endpoints", "revision", rev, "endpoints", len(eps), "failed", failed, "duration", time.Since(start))
	}
}

// syncCIDRIdentities gives every prefix the rules select a node-local
// identity in the ipcache, and removes those no rule needs any more.
func (p *policyModule) syncCIDRIdentities() error {
	want := map[netip.Prefix]bool{}
	for _, pf := range p.repo.CIDRPrefixes() {
		want[pf] = true
	}
	p.mu.Lock()
	var add, del []netip.Prefix
	for pf := range want {
		if _, ok := p.cidrIDs[pf]; !ok {
			p.cidrIDs[pf] = identity.LocalScope | p.nextCIDR
			p.nextCIDR++
			add = append(add, pf)
		}
	}
	for pf := range p.cidrIDs {
		if !want[pf] {
			delete(p.cidrIDs, pf)
			del = append(del, pf)
		}
	}
	if len(add)+len(del) > 0 {
		p.cidrGen++
	}
	ids := make(map[netip.Prefix]identity.NumericIdentity, len(add))
	for _, pf := range add {
		ids[pf] = p.cidrIDs[pf]
	}
	p.mu.Unlock()
	if p.dp == nil || p.dp.loader.Maps() == nil {
		return nil
	}
	// Every prefix with its in-cluster identity: a pod's or a node's
	// address inside it carries that one for the rules (policycidr).
	// Set every time (it writes only the difference), so a failed
	// transaction is made up by the next pass.
	p.mu.Lock()
	inCluster := make(map[netip.Prefix]identity.NumericIdentity, len(p.cidrIDs))
	for pf, id := range p.cidrIDs {
		inCluster[pf] = id | identity.InClusterCIDR
	}
	p.mu.Unlock()
	if err := p.dp.policyCIDR.Set(inCluster); err != nil {
		return err
	}
	// Generated claims: a rule's CIDR equal to an endpoint's address never
	// hides the endpoint's identity (the ipcache's precedence).
	// One transaction for the change's prefixes.
	return p.dp.ipcache.Write(func(w *ipcache.Writer) error {
		for pf, id := range ids {
			if err := w.Upsert(pf, ipcache.Entry{Identity: id, Source: ipcache.SourceGenerated, Owner: ipcache.OwnerPolicyCIDR(pf)}); err != nil {
				return err
			}
		}
		for _, pf := range del {
			if err := w.Delete(pf, ipcache.SourceGenerated, ipcache.OwnerPolicyCIDR(pf)); err != nil {
				return err
			}
		}
		return nil
	})
}

// universe is every identity policy can select right now.
func (p *policyModule) universe() policy.Universe {
	u := policy.ReservedPeers()
	if p.dp == nil {
		return u
	}
	named := p.localNamedPorts()
	for _, id := range p.idTable.List() {
		u = append(u, policy.Peer{ID: id.ID, Labels: id.Labels, NamedPorts: named[id.ID]})
	}
	p.mu.Lock()
	for pf, id := range p.cidrIDs {
		// The prefix's identity for addresses outside the cluster, and the
		// one pods and nodes inside it carry for policy.
		u = append(u, policy.Peer{ID: id, Labels: []string{"cidr:" + pf.String()}, CIDR: pf},
			policy.Peer{ID: id | identity.InClusterCIDR, Labels: []string{"cidr:" + pf.String()}, CIDR: pf})
	}
	p.mu.Unlock()
	return u
}

// localNamedPorts are the named container ports of the local pods, per
// identity (the union when pods of one identity name ports differently),
// for egress rules naming a destination's port.
func (p *policyModule) localNamedPorts() map[identity.NumericIdentity]map[string]policy.NamedPort {
	if p.k8s == nil || p.eps.mgr == nil {
		return nil
	}
	out := map[identity.NumericIdentity]map[string]policy.NamedPort{}
	for _, ep := range p.eps.mgr.List() {
		ports := p.k8s.namedPorts(ep)
		if len(ports) == 0 || ep.Identity == 0 {
			continue
		}
		id := identity.NumericIdentity(ep.Identity)
		if out[id] == nil {
			out[id] = map[string]policy.NamedPort{}
		}
		for name, np := range ports {
			out[id][name] = np
		}
	}
	p.k8s.addRemoteNamedPorts(out)
	return out
}

// universeKey is the current universe's identification.
func (p *policyModule) universeKey() universeKey {
	var gen uint64
	if p.dp != nil {
		gen = p.idTable.Generation()
	}
	p.mu.Lock()
	cidr := p.cidrGen
	p.mu.Unlock()
	return universeKey{identities: gen, cidr: cidr, epoch: p.universeEpoch.Load()}
}

// sharedFor returns the shared universe and results for the current
// universe and revision rev, building the universe only when it changed.
func (p *policyModule) sharedFor(rev uint64) *sharedResolution {
	key := p.universeKey()
	p.sharedMu.Lock()
	defer p.sharedMu.Unlock()
	sh := p.shared
	switch {
	case sh == nil || sh.key != key:
		version := uint64(1)
		if sh != nil {
			version = sh.version + 1
		}
		sh = &sharedResolution{key: key, version: version, universe: p.universe(), revision: rev, results: map[string]policy.Result{}}
		p.shared = sh
	case sh.revision != rev:
		sh = &sharedResolution{key: key, version: sh.version, universe: sh.universe, revision: rev, results: map[string]policy.Result{}}
		p.shared = sh
	}
	return sh
}

// resolutionKey is what a resolution depends on of the endpoint: its label
// set and its own named ports.
func resolutionKey(ep policy.Endpoint) string {
	var b strings.Builder
	for _, l := range ep.Labels {
		b.WriteString(l)
		b.WriteByte(0)
	}
	names := make([]string, 0, len(ep.NamedPorts))
	for n := range ep.NamedPorts {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		np := ep.NamedPorts[n]
		fmt.Fprintf(&b, "|%s=%d/%d", n, np.Port, np.Proto)
	}
	return b.String()
}

// resolve computes ep's policy through the selector cache; endpoints with
// the same labels and named ports share one resolution per revision.
func (p *policyModule) resolve(ep *endpoint.Endpoint) policy.Result {
	pe := policy.Endpoint{Labels: endpointLabels(ep), NamedPorts: p.k8s.namedPorts(ep)}
	key := resolutionKey(pe)
	sh := p.sharedFor(p.repo.Revision())
	p.sharedMu.Lock()
	res, ok := sh.results[key]
	p.sharedMu.Unlock()
	if !ok {
		res = p.repo.ResolveCached(pe, sh.universe, sh.version, p.cache)
		// A rule change between the revision read above and the
		// resolution: the result is right for its own revision, but not one
		// to share under sh's.
		if res.Revision == sh.revision {
			p.sharedMu.Lock()
			sh.results[key] = res
			p.sharedMu.Unlock()
		}
	}
	p.mu.Lock()
	p.results[ep.ID] = res
	p.mu.Unlock()
	return res
}

// selects is the default-mode enforcement of ep.
func (p *policyModule) selects(ep *endpoint.Endpoint) (bool, bool) {
	res := p.resolve(ep)
	return res.EnforceIngress, res.EnforceEgress
}

func toMapKey(epID uint16, k policy.Key) maps.PolicyKey {
	return maps.PolicyKey{EndpointID: epID, Direction: k.Direction, Identity: uint32(k.Identity), Proto: k.Proto, Port: k.Port, PortPrefixLen: k.PrefixLen}
}

// realize writes the difference between ep's realized and desired
// policy to the BPF map; after an agent restart the realized state is read
// back from the pinned map, so nothing is rewritten needlessly and the
// entries keep enforcing throughout.
func (p *policyModule) realize(ctx context.Context, ep *endpoint.Endpoint, pm policyMap) error {
	res := p.resolve(ep)
	want := res.MapState
	if p.runtime.Values().PolicyEnforcement == option.EnforcementNever {
		want = policy.MapState{}
	}
	p.mu.Lock()
	cur, ok := p.realized[ep.ID]
	p.mu.Unlock()
	if !ok {
		pinned, err := pm.DumpEndpoint(ep.ID)
		if err != nil {
			return fmt.Errorf("read realized policy of endpoint %d: %w", ep.ID, err)
		}
		cur = policy.MapState{}
		for k, v := range pinned {
			cur[policy.Key{Identity: identity.NumericIdentity(k.Identity), Direction: k.Direction, Proto: k.Proto, Port: k.Port, PrefixLen: k.PortPrefixLen}] = policy.Entry{Deny: v.Deny, Cookie: v.Cookie, Views: viewFlags(v.Flags)}
		}
	}
	upserts, deletes := policy.Diff(cur, want)
	// Write new entries before removing old ones: a packet in between sees
	// the union, never an empty state that would deny everything.
	for k, e := range upserts {
		if err := pm.Upsert(toMapKey(ep.ID, k), mapValue(e)); err != nil {
			return err
		}
	}
	for _, k := range deletes {
		if err := pm.Delete(toMapKey(ep.ID, k)); err != nil {
			return err
		}
	}
	p.mu.Lock()
	p.realized[ep.ID] = want
	p.mu.Unlock()
	ep.PolicyRevision = res.Revision
	if len(upserts)+len(deletes) > 0 {
		p.log.Debug("Policy map updated", "endpoint", ep.ID, "revision", res.Revision, "upserts", len(upserts), "deletes", len(deletes))
	}
	return nil
}

// remove deletes ep's entries from the policy map.
func (p *policyModule) remove(ep *endpoint.Endpoint, pm policyMap) error {
	if err := pm.DeleteEndpoint(ep.ID); err != nil {
		return fmt.Errorf("remove the policy of endpoint %d: %w", ep.ID, err)
	}
	p.mu.Lock()
	delete(p.realized, ep.ID)
	delete(p.results, ep.ID)
	p.mu.Unlock()
	return nil
}

// endpointPolicyModel is an endpoint's realized policy for the API.
func (p *policyModule) endpointPolicyModel(ep *endpoint.Endpoint) *models.EndpointPolicyStatus {
	p.mu.Lock()
	state := p.realized[ep.ID]
	p.mu.Unlock()
	ids := func(dir uint8, deny bool) []int64 {
		seen := map[int64]bool{}
		for k, e := range state {
			if k.Direction == dir && e.Deny == deny {
				seen[int64(k.Identity)] = true
			}
		}
		out := []int64{}
		for id := range seen {
			out = append(out, id)
		}
		sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
		return out
	}
	enabled := models.EndpointPolicyEnabledNone
	switch {
	case ep.EnforceIngress && ep.EnforceEgress:
		enabled = models.EndpointPolicyEnabledBoth
	case ep.EnforceIngress:
		enabled = models.EndpointPolicyEnabledIngress
	case ep.EnforceEgress:
		enabled = models.EndpointPolicyEnabledEgress
	}
	pol := &models.EndpointPolicy{
		ID: int64(ep.Identity), PolicyEnabled: enabled, PolicyRevision: int64(ep.PolicyRevision),
		AllowedIngressIdentities: ids(policy.Ingress, false), DeniedIngressIdentities: ids(policy.Ingress, true),
		AllowedEgressIdentities: ids(policy.Egress, false), DeniedEgressIdentities: ids(policy.Egress, true),
	}
	// The spec is the revision the endpoint must realize (the same
	// identities once it has).
	spec := *pol
	spec.PolicyRevision = int64(ep.DesiredPolicyRevision)
	return &models.EndpointPolicyStatus{Realized: pol, Spec: &spec}
}

// policySourceAPI is the repository source of the rules imported through
// the API: the only rules the policy file keeps.
const policySourceAPI = "api"

// policyFile keeps the rules imported through the API across restarts, so
// a restarted agent enforces exactly what it enforced before (Kubernetes
// policies come back from the API server instead).
func policyFile(cfg Config) string { return filepath.Join(cfg.StateDir, "policy.json") }

// restorePolicy loads the saved rules; the file's writer (a job) starts
// after it: a file that does not load stops the start (enforcing nothing
// would fail open), and nothing is written before the file is read.
func (p *policyModule) restorePolicy(context.Context) error {
	rules, err := p.file.Load()
	if err != nil {
		return err
	}
	if len(rules) > 0 {
		if _, err := p.repo.Add(rules, "", policySourceAPI, false); err != nil {
			return fmt.Errorf("restore the rules of policy file %s: %w", p.file.Path(), err)
		}
		p.log.Info("Restored policy rules", "rules", len(rules), "file", p.file.Path())
	}
	return nil
}

// enforcement decides, per direction, whether policy applies to ep: never,
// always, or (default) only where a rule selects the endpoint.
// mapValue is an entry as the datapath holds it.
func mapValue(e policy.Entry) maps.PolicyValue {
	return maps.PolicyValue{Deny: e.Deny, Cookie: e.Cookie, Flags: uint8(e.Views)}
}

// viewFlags reads an entry's view flags back from the datapath's.
func viewFlags(f uint8) policy.ViewFlags {
	return policy.ViewFlags(f) & (policy.EnforcedNone | policy.AuditNone | policy.AuditDeny)
}

// The view flags are the datapath's POLICY_F_* values: a mismatch fails
// the build (a constant index out of range).
var _ = [1]struct{}{}[uint8(policy.EnforcedNone)^maps.PolicyFlagENone|
	uint8(policy.AuditNone)^maps.PolicyFlagANone|uint8(policy.AuditDeny)^maps.PolicyFlagADeny]

// auditing is whether an audited policy selects ep, per direction (never
// when enforcement is off or always on for every endpoint).
func (p *policyModule) auditing(ep *endpoint.Endpoint) (ingress, egress bool) {
	if p.runtime.Values().PolicyEnforcement != option.EnforcementDefault {
		return false, false
	}
	p.mu.Lock()
	res, ok := p.results[ep.ID]
	p.mu.Unlock()
	if !ok {
		res = p.resolve(ep)
	}
	return res.AuditIngress, res.AuditEgress
}

func (p *policyModule) enforcement(ep *endpoint.Endpoint) (ingress, egress bool) {
	switch p.runtime.Values().PolicyEnforcement {
	case option.EnforcementNever:
		return false, false
	case option.EnforcementAlways:
		return true, true
	}
	p.mu.Lock()
	res, ok := p.results[ep.ID]
	p.mu.Unlock()
	if !ok {
		return p.selects(ep)
	}
	return res.EnforceIngress, res.EnforceEgress
}

// Repository is the policy repository (the flows name rules from it).
func (p *policyModule) Repository() *policy.Repository { return p.repo }

// CIDRIdentityLabels is the label of the prefix the policy gave the
// node-local identity id, or nil. (A scan: there are as many CIDR
// identities as prefixes in the rules, and only flows to and from them ask.)
func (p *policyModule) CIDRIdentityLabels(id identity.NumericIdentity) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	for pf, cid := range p.cidrIDs {
		if cid == id&^identity.InClusterCIDR {
			return []string{"cidr:" + pf.String()}
		}
	}
	return nil
}

// SelectingRules are the IDs of the rules that select a local endpoint,
// as its last resolution found them; false before its first.
func (p *policyModule) SelectingRules(epID uint16) ([]uint32, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	res, ok := p.results[epID]
	return res.Rules, ok
}
