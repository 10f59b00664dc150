package agent

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/cilium/cilium/api/v1/models"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/ipcache"
	"github.com/tendril-net/tendril/pkg/option"
	"github.com/tendril-net/tendril/pkg/policy"
	"github.com/tendril-net/tendril/pkg/policy/policyfile"
)

// policyModule resolves the repository's rules for each endpoint and
// realizes the difference in the BPF policy map.
type policyModule struct {
	a    *Agent
	repo *policy.Repository

	mu       sync.Mutex
	realized map[uint16]policy.MapState
	results  map[uint16]policy.Result
	cidrIDs  map[netip.Prefix]identity.NumericIdentity
	nextCIDR identity.NumericIdentity
	cidrGen  uint64
	cache    *policy.SelectorCache

	regen chan struct{}

	// file keeps the rules imported through the API across restarts;
	// its writer runs from restorePolicy to stopPolicyFile.
	file       *policyfile.File
	fileCancel context.CancelFunc
	fileDone   chan struct{}
}

func newPolicyModule(a *Agent) *policyModule {
	p := &policyModule{
		a: a, repo: policy.NewRepository(),
		realized: map[uint16]policy.MapState{}, results: map[uint16]policy.Result{},
		cidrIDs: map[netip.Prefix]identity.NumericIdentity{}, nextCIDR: 1, cache: policy.NewSelectorCache(),
		regen: make(chan struct{}, 1),
	}
	p.file = policyfile.New(a.policyFile(), p.repo, policySourceAPI, a.log.With("module", "policy-file"))
	p.repo.Subscribe(func(uint64) { p.triggerRegeneration() })
	return p
}

// triggerRegeneration asks for a regeneration of every endpoint; requests
// that arrive while one is pending fold into it.
func (p *policyModule) triggerRegeneration() {
	select {
	case p.regen <- struct{}{}:
	default:
	}
}

// run regenerates all endpoints when rules, identities or the enforcement
// mode change.
func (p *policyModule) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.regen:
		}
		if err := p.syncCIDRIdentities(); err != nil {
			p.a.log.Error("CIDR identities", "error", err)
		}
		if mgr := p.a.endpoints.mgr; mgr != nil && p.a.datapath != nil {
			start := time.Now()
			n := 0
			for _, ep := range mgr.List() {
				if err := mgr.Refresh(ctx, ep.ID, p.a.datapath.refreshPolicy); err != nil {
					p.a.log.Error("Apply a policy change to an endpoint", "endpoint", ep.ID, "error", err)
				}
				n++
			}
			p.a.log.Debug("Applied policy to endpoints", "revision", p.repo.Revision(), "endpoints", n, "duration", time.Since(start))
		}
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
	if p.a.datapath == nil || p.a.datapath.loader.Maps() == nil {
		return nil
	}
	// Generated claims: a rule's CIDR equal to an endpoint's address never
	// hides the endpoint's identity (the ipcache's precedence).
	ic := p.a.datapath.ipcache
	for pf, id := range ids {
		if err := ic.Upsert(pf, ipcache.Entry{Identity: id, Source: ipcache.SourceGenerated}); err != nil {
			return err
		}
	}
	for _, pf := range del {
		if err := ic.Delete(pf, ipcache.SourceGenerated); err != nil {
			return err
		}
	}
	return nil
}

// universe is every identity policy can select right now.
func (p *policyModule) universe() policy.Universe {
	u := policy.ReservedPeers()
	if p.a.datapath == nil {
		return u
	}
	named := p.localNamedPorts()
	for _, id := range p.a.datapath.identities.List() {
		u = append(u, policy.Peer{ID: id.ID, Labels: id.Labels, NamedPorts: named[id.ID]})
	}
	p.mu.Lock()
	for pf, id := range p.cidrIDs {
		u = append(u, policy.Peer{ID: id, Labels: []string{"cidr:" + pf.String()}, CIDR: pf})
	}
	p.mu.Unlock()
	return u
}

// localNamedPorts are the named container ports of the local pods, per
// identity (the union when pods of one identity name ports differently),
// for egress rules naming a destination's port.
func (p *policyModule) localNamedPorts() map[identity.NumericIdentity]map[string]policy.NamedPort {
	if p.a.k8s == nil || p.a.endpoints.mgr == nil {
		return nil
	}
	out := map[identity.NumericIdentity]map[string]policy.NamedPort{}
	for _, ep := range p.a.endpoints.mgr.List() {
		ports := p.a.k8s.namedPorts(ep)
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
	p.a.k8s.addRemoteNamedPorts(out)
	return out
}

// universeVersion changes whenever the universe does.
func (p *policyModule) universeVersion() uint64 {
	var gen uint64
	if p.a.datapath != nil {
		gen = p.a.datapath.identities.Generation()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return gen<<24 | p.cidrGen
}

// resolve computes ep's policy through the selector cache.
func (p *policyModule) resolve(ep *endpoint.Endpoint) policy.Result {
	version := p.universeVersion()
	res := p.repo.ResolveCached(policy.Endpoint{Labels: endpointLabels(ep), NamedPorts: p.a.k8s.namedPorts(ep)}, p.universe(), version, p.cache)
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

// realizePolicy writes the difference between ep's realized and desired
// policy to the BPF map; after an agent restart the realized state is read
// back from the pinned map, so nothing is rewritten needlessly and the
// entries keep enforcing throughout.
func (a *Agent) realizePolicy(ctx context.Context, ep *endpoint.Endpoint) error {
	p := a.policy
	res := p.resolve(ep)
	want := res.MapState
	if a.runtime.Values().PolicyEnforcement == option.EnforcementNever {
		want = policy.MapState{}
	}
	pm := a.datapath.loader.Maps().PolicyMap()
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
			cur[policy.Key{Identity: identity.NumericIdentity(k.Identity), Direction: k.Direction, Proto: k.Proto, Port: k.Port, PrefixLen: k.PortPrefixLen}] = policy.Entry{Deny: v.Deny, Cookie: v.Cookie}
		}
	}
	upserts, deletes := policy.Diff(cur, want)
	// Write new entries before removing old ones: a packet in between sees
	// the union, never an empty state that would deny everything.
	for k, e := range upserts {
		if err := pm.Upsert(toMapKey(ep.ID, k), maps.PolicyValue{Deny: e.Deny, Cookie: e.Cookie}); err != nil {
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
		a.log.Debug("Policy map updated", "endpoint", ep.ID, "revision", res.Revision, "upserts", len(upserts), "deletes", len(deletes))
	}
	return nil
}

// removePolicy deletes ep's entries from the policy map.
func (a *Agent) removePolicy(ep *endpoint.Endpoint) error {
	p := a.policy
	if err := a.datapath.loader.Maps().PolicyMap().DeleteEndpoint(ep.ID); err != nil {
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
	return &models.EndpointPolicyStatus{Realized: pol, Spec: pol}
}

// policySourceAPI is the repository source of the rules imported through
// the API: the only rules the policy file keeps.
const policySourceAPI = "api"

// policyFile keeps the rules imported through the API across restarts, so
// a restarted agent enforces exactly what it enforced before (Kubernetes
// policies come back from the API server instead).
func (a *Agent) policyFile() string { return filepath.Join(a.cfg.StateDir, "policy.json") }

// restorePolicy loads the saved rules, then starts the file's writer: a
// file that does not load stops the start (enforcing nothing would fail
// open), and nothing is written before the file is read.
func (p *policyModule) restorePolicy(context.Context) error {
	rules, err := p.file.Load()
	if err != nil {
		return err
	}
	if len(rules) > 0 {
		if _, err := p.repo.Add(rules, "", policySourceAPI, false); err != nil {
			return fmt.Errorf("restore the rules of policy file %s: %w", p.file.Path(), err)
		}
		p.a.log.Info("Restored policy rules", "rules", len(rules), "file", p.file.Path())
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.fileCancel, p.fileDone = cancel, make(chan struct{})
	go func() {
		defer close(p.fileDone)
		p.file.Run(ctx)
	}()
	return nil
}

// stopPolicyFile stops the file's writer once it has written the last
// changes.
func (p *policyModule) stopPolicyFile(ctx context.Context) error {
	if p.fileCancel == nil {
		return nil
	}
	p.fileCancel()
	select {
	case <-p.fileDone:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stop the policy file writer: %w", ctx.Err())
	}
}
