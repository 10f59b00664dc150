package agentpolicy

import (
	"fmt"
	"slices"
	"strings"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/fqdn/dnsfallback"
	"github.com/tendril-net/tendril/pkg/option"
	"github.com/tendril-net/tendril/pkg/policy"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// The fallback's kinds are the datapath's DNSFB_KIND_*: a mismatch fails
// the build (a constant index out of range).
var _ = [1]struct{}{}[dnsfallback.KindName^maps.DNSFallbackName|dnsfallback.KindSuffix^maps.DNSFallbackSuffix|
	dnsfallback.KindAll^maps.DNSFallbackAll|dnsfallback.KindFilter^maps.DNSFallbackFilter]

// DNSFallbackMap is the datapath's DNS fallback map (tdr_dns_fallback_v1)
// as the realization writes it.
type DNSFallbackMap interface {
	// Dump reads every entry, by endpoint (one walk of the whole map).
	Dump() (map[uint16][]maps.DNSFallbackKey, error)
	// Has looks one entry up.
	Has(maps.DNSFallbackKey) (bool, error)
	Put(maps.DNSFallbackKey) error
	Delete(maps.DNSFallbackKey) error
}

// dnsFallbackMap is the open map, or nil (no datapath yet, or none).
func (p *Module) dnsFallbackMap() DNSFallbackMap {
	if p.dnsfbMap != nil {
		return p.dnsfbMap
	}
	if p.dp == nil {
		return nil
	}
	m := p.dp.Maps()
	if m == nil || m.DNSFallback == nil {
		return nil
	}
	return m.DNSFallbackMap()
}

type dnsfbSet map[maps.DNSFallbackKey]struct{}

// dnsFallbackWant is what endpoint epID's fallback entries must be for
// its resolution res: nothing when no enforced egress entry sends a flow
// to the DNS proxy; else the union of the DNS rules of every such entry
// (whatever the destination: the map has no destination, so a name one
// DNS server's rule allows passes to every DNS server the endpoint may
// reach during the fallback) with the filter marker, or only the "all
// names" marker when a rule is beyond the map (unexpressed names those
// patterns).
func dnsFallbackWant(epID uint16, res policy.Result, never bool) (want dnsfbSet, unexpressed []string) {
	want = dnsfbSet{}
	if never {
		return want, nil
	}
	var rules []api.PortRuleDNS
	allowAll, any := false, false
	for k, r := range res.L7 {
		e, ok := res.MapState[k]
		if k.Direction != policy.Egress || !ok || e.Deny || e.Proxy != policy.ProxyDNS || e.Views.Has(policy.EnforcedNone) || r == nil {
			continue
		}
		any = true
		rules = append(rules, r.DNS...)
		allowAll = allowAll || r.AllowAll
	}
	if !any {
		return want, nil
	}
	names := dnsfallback.Compile(rules, allowAll)
	if names.All {
		want[maps.DNSFallbackKey{EndpointID: epID, Kind: maps.DNSFallbackAll}] = struct{}{}
		return want, names.Unexpressed
	}
	for e := range names.Entries {
		want[maps.DNSFallbackKey{EndpointID: epID, Kind: e.Kind, Hash: e.Hash}] = struct{}{}
	}
	want[maps.DNSFallbackKey{EndpointID: epID, Kind: maps.DNSFallbackFilter}] = struct{}{}
	return want, nil
}

// dnsfbCurrent is what the map holds for epID: the last write, or on the
// endpoint's first realization in this run what the pinned map holds for
// it (after a restart, the previous run's entries). Called with p.dnsfbMu
// held.
//
// The map is keyed by hash, not by endpoint, so reading one endpoint's
// entries is a walk over all of them; a walk per endpoint made a restart
// O(endpoints × entries). The first miss walks the map once and keeps
// what it found by endpoint (dnsfbPinned); each endpoint's first
// realization takes its part and looks each entry up again before
// trusting it: the loader's purge of an endpoint that was not restored
// may have deleted its entries since the walk, and a stale "filter
// marker present" would leave a reused ID's names unfiltered. Nothing
// else adds entries (the previous run is gone, and this module writes
// through the cache), so an entry missing from the walk is not there.
func (p *Module) dnsfbCurrent(dm DNSFallbackMap, epID uint16) (dnsfbSet, error) {
	if cur, ok := p.dnsfb[epID]; ok {
		return cur, nil
	}
	if p.dnsfbPinned == nil {
		all, err := dm.Dump()
		if err != nil {
			return nil, fmt.Errorf("read the DNS fallback map: %w", err)
		}
		if all == nil {
			all = map[uint16][]maps.DNSFallbackKey{}
		}
		p.dnsfbPinned = all
	}
	cur := dnsfbSet{}
	for _, k := range p.dnsfbPinned[epID] {
		ok, err := dm.Has(k)
		if err != nil {
			return nil, fmt.Errorf("read the DNS fallback map: %w", err)
		}
		if ok {
			cur[k] = struct{}{}
		}
	}
	delete(p.dnsfbPinned, epID)
	p.dnsfb[epID] = cur
	return cur, nil
}

// realizeDNSFallback writes the difference between endpoint epID's
// fallback entries and what res wants, in an order where no state in
// between lets through a name that neither the old nor the new entries
// let through: the "all names" marker goes in first; then stale names
// out (only stricter while the filter marker stays), new names in, the
// filter marker in; last the markers that must go (a filter marker gone
// with its names lets everything through, which only the new state may).
// After a kill -9 the pinned map keeps filtering as last written, and
// the restarted agent's first write is this same difference.
func (p *Module) realizeDNSFallback(epID uint16, res policy.Result) error {
	dm := p.dnsFallbackMap()
	if dm == nil {
		return nil
	}
	want, unexpressed := dnsFallbackWant(epID, res, p.runtime.Values().PolicyEnforcement == option.EnforcementNever)
	p.dnsfbMu.Lock()
	defer p.dnsfbMu.Unlock()
	cur, err := p.dnsfbCurrent(dm, epID)
	if err != nil {
		return err
	}
	if len(unexpressed) > 0 {
		why := strings.Join(unexpressed, ",")
		if p.dnsfbAllLogged[epID] != why {
			p.dnsfbAllLogged[epID] = why
			p.log.Warn("DNS rules beyond the datapath's fallback: this endpoint's names are unfiltered while no DNS proxy listens",
				"endpoint", epID, "patterns", unexpressed)
		}
	} else {
		delete(p.dnsfbAllLogged, epID)
	}
	put := func(k maps.DNSFallbackKey) error {
		if _, ok := cur[k]; ok {
			return nil
		}
		if err := dm.Put(k); err != nil {
			return err
		}
		cur[k] = struct{}{}
		return nil
	}
	del := func(k maps.DNSFallbackKey) error {
		if err := dm.Delete(k); err != nil {
			return err
		}
		delete(cur, k)
		return nil
	}
	allKey := maps.DNSFallbackKey{EndpointID: epID, Kind: maps.DNSFallbackAll}
	filterKey := maps.DNSFallbackKey{EndpointID: epID, Kind: maps.DNSFallbackFilter}
	_, wantAll := want[allKey]
	_, wantFilter := want[filterKey]
	if wantAll {
		if err := put(allKey); err != nil {
			return fmt.Errorf("DNS fallback of endpoint %d: %w", epID, err)
		}
	}
	for _, k := range sortedDNSFallbackKeys(cur) {
		if _, ok := want[k]; !ok && k != allKey && k != filterKey {
			if err := del(k); err != nil {
				return fmt.Errorf("DNS fallback of endpoint %d: %w", epID, err)
			}
		}
	}
	for _, k := range sortedDNSFallbackKeys(want) {
		if k != allKey && k != filterKey {
			if err := put(k); err != nil {
				return fmt.Errorf("DNS fallback of endpoint %d: %w", epID, err)
			}
		}
	}
	if wantFilter {
		if err := put(filterKey); err != nil {
			return fmt.Errorf("DNS fallback of endpoint %d: %w", epID, err)
		}
	} else if _, ok := cur[filterKey]; ok {
		if err := del(filterKey); err != nil {
			return fmt.Errorf("DNS fallback of endpoint %d: %w", epID, err)
		}
	}
	if _, ok := cur[allKey]; ok && !wantAll {
		if err := del(allKey); err != nil {
			return fmt.Errorf("DNS fallback of endpoint %d: %w", epID, err)
		}
	}
	return nil
}

// removeDNSFallback deletes endpoint epID's entries: the filter marker
// first (the endpoint is going; its names no longer matter), then the
// rest.
func (p *Module) removeDNSFallback(epID uint16) error {
	dm := p.dnsFallbackMap()
	if dm == nil {
		return nil
	}
	p.dnsfbMu.Lock()
	defer p.dnsfbMu.Unlock()
	cur, err := p.dnsfbCurrent(dm, epID)
	if err != nil {
		return err
	}
	keys := sortedDNSFallbackKeys(cur)
	slices.SortStableFunc(keys, func(a, b maps.DNSFallbackKey) int {
		return boolRank(b.Kind == maps.DNSFallbackFilter) - boolRank(a.Kind == maps.DNSFallbackFilter)
	})
	for _, k := range keys {
		if err := dm.Delete(k); err != nil {
			return fmt.Errorf("remove the DNS fallback of endpoint %d: %w", epID, err)
		}
		delete(cur, k)
	}
	delete(p.dnsfb, epID)
	delete(p.dnsfbAllLogged, epID)
	return nil
}

func boolRank(b bool) int {
	if b {
		return 1
	}
	return 0
}

func sortedDNSFallbackKeys(s dnsfbSet) []maps.DNSFallbackKey {
	out := make([]maps.DNSFallbackKey, 0, len(s))
	for k := range s {
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b maps.DNSFallbackKey) int {
		if a.Kind != b.Kind {
			return int(a.Kind) - int(b.Kind)
		}
		switch {
		case a.Hash < b.Hash:
			return -1
		case a.Hash > b.Hash:
			return 1
		}
		return 0
	})
	return out
}
