// Selector cache: which identities each peer selector selects, kept per
// repository revision and updated incrementally as identities come and go,
// so resolving many endpoints (ResolveCached) matches each selector once.

package policy

import (
	"maps"
	"slices"
	"sync"

	"github.com/tendril-net/tendril/pkg/identity"
)

// SelectorCache remembers which identities each peer selector selects for
// one repository revision, so resolving many endpoints matches every
// selector against every identity once. When only the universe changes
// (identities come and go), the cache is updated incrementally: only the
// added and changed identities are matched against the cached selectors.
type SelectorCache struct {
	mu       sync.Mutex
	revision uint64
	version  uint64
	sets     []labelSet
	universe Universe
	// index finds a universe entry by identity (egress named ports need
	// the selected peers' ports).
	index    map[identity.NumericIdentity]int
	selected map[selectorKey]*cachedSelection
}

type selectorKey struct {
	rule uint32
	dir  uint8
	deny bool
	idx  int
}

// cachedSelection is what a selector selects, with what it takes to match
// a new identity against it. ids is replaced, never changed in place:
// callers may hold the old slice.
type cachedSelection struct {
	sec section
	ns  string
	ids []identity.NumericIdentity
}

// NewSelectorCache returns an empty cache.
func NewSelectorCache() *SelectorCache { return &SelectorCache{} }

// ResolveCached is Resolve through a selector cache; version must change
// whenever the universe does.
func (r *Repository) ResolveCached(ep Endpoint, universe Universe, version uint64, c *SelectorCache) Result {
	rev := r.Revision()
	c.mu.Lock()
	switch {
	case c.selected == nil || c.revision != rev:
		c.reset(rev, version, universe)
	case c.version != version:
		c.update(version, universe)
	}
	c.mu.Unlock()
	return r.resolveViews(ep, universe, c)
}

// reset drops every cached selection.
func (c *SelectorCache) reset(rev, version uint64, universe Universe) {
	c.revision, c.version, c.universe = rev, version, universe
	c.sets = make([]labelSet, len(universe))
	c.index = make(map[identity.NumericIdentity]int, len(universe))
	for i, p := range universe {
		c.sets[i] = newLabelSet(p.Labels)
		c.index[p.ID] = i
	}
	c.selected = map[selectorKey]*cachedSelection{}
}

// update moves the cache to a new universe: identities that vanished or
// whose labels (or CIDR) changed leave every selection, added and changed
// ones are matched against every cached selector. When most of the
// universe changed, starting over is cheaper.
func (c *SelectorCache) update(version uint64, universe Universe) {
	sets := make([]labelSet, len(universe))
	var fresh []int // universe positions to match
	gone := map[identity.NumericIdentity]bool{}
	// A new universe is mostly the old one in the same order (the agent
	// builds it from the identities each time): a peer is looked for at
	// its old position first, and the index is the old one cloned and
	// patched where peers moved or came, far cheaper than built again.
	var patch []int // positions of peers that moved or are new
	for i, p := range universe {
		oi, ok := i, i < len(c.universe) && c.universe[i].ID == p.ID
		if !ok {
			oi, ok = c.index[p.ID]
			patch = append(patch, i)
		}
		if ok && samePeer(c.universe[oi], p) {
			sets[i] = c.sets[oi]
			continue
		}
		sets[i] = newLabelSet(p.Labels)
		fresh = append(fresh, i)
		if ok {
			gone[p.ID] = true // changed: leaves, then is matched again
		}
	}
	var index map[identity.NumericIdentity]int
	if len(patch) <= len(universe)/8 {
		index = maps.Clone(c.index)
		for _, i := range patch {
			index[universe[i].ID] = i
		}
		// An identity is still there when its position holds it;
		// otherwise it left the universe, and the clone still names it.
		for id, i := range index {
			if i >= len(universe) || universe[i].ID != id {
				gone[id] = true
				delete(index, id)
			}
		}
	} else {
		index = make(map[identity.NumericIdentity]int, len(universe))
		for i, p := range universe {
			index[p.ID] = i
		}
		for id := range c.index {
			if _, ok := index[id]; !ok {
				gone[id] = true
			}
		}
	}
	if len(fresh)+len(gone) > len(universe)/4+8 {
		c.reset(c.revision, version, universe)
		return
	}
	c.version, c.universe, c.sets, c.index = version, universe, sets, index
	if len(fresh) == 0 && len(gone) == 0 {
		return
	}
	for _, sel := range c.selected {
		var ids []identity.NumericIdentity
		changed := false
		if len(gone) > 0 {
			ids = make([]identity.NumericIdentity, 0, len(sel.ids))
			for _, id := range sel.ids {
				if gone[id] {
					changed = true
					continue
				}
				ids = append(ids, id)
			}
		} else {
			ids = sel.ids
		}
		for _, i := range fresh {
			if sel.sec.peerMatchesSet(universe[i], sets[i], sel.ns) {
				if !changed {
					ids = append(append([]identity.NumericIdentity(nil), ids...), universe[i].ID)
					changed = true
					continue
				}
				ids = append(ids, universe[i].ID)
			}
		}
		if changed {
			sel.ids = ids
		}
	}
}

// samePeer reports whether a peer still selects alike: same labels, same
// CIDR. Named ports do not change selection.
func samePeer(a, b Peer) bool {
	// Names count: a CIDR identity whose learned names changed must be
	// matched again by toFQDNs selections.
	return a.CIDR == b.CIDR && slices.Equal(a.Labels, b.Labels) && slices.Equal(a.Names, b.Names)
}

func (c *SelectorCache) lookup(k selectorKey, s section, ns string) []identity.NumericIdentity {
	c.mu.Lock()
	sel, ok := c.selected[k]
	c.mu.Unlock()
	if ok {
		return sel.ids
	}
	ids := []identity.NumericIdentity{}
	c.mu.Lock()
	universe, sets := c.universe, c.sets
	c.mu.Unlock()
	for i, p := range universe {
		if s.peerMatchesSet(p, sets[i], ns) {
			ids = append(ids, p.ID)
		}
	}
	c.mu.Lock()
	c.selected[k] = &cachedSelection{sec: s, ns: ns, ids: ids}
	c.mu.Unlock()
	return ids
}

// peers returns the universe entries of ids.
func (c *SelectorCache) peers(ids []identity.NumericIdentity) []Peer {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Peer, 0, len(ids))
	for _, id := range ids {
		if i, ok := c.index[id]; ok {
			out = append(out, c.universe[i])
		}
	}
	return out
}
