package identity

import (
	"sort"
	"sync"
)

// ClusterCache is what a cluster-wide allocator knows: every identity of
// the cluster (learned from its store's watch and its own creations) and
// this node's references, with the generation and listeners the policy
// engine follows. The CRD and kvstore allocators embed it and add how
// they create and reference identities.
type ClusterCache struct {
	mu    sync.Mutex
	byID  map[NumericIdentity][]string
	byKey map[string]NumericIdentity
	refs  map[NumericIdentity]int
	// bound is the labels key each locally referenced identity was
	// referenced for. It outlives a change of byID: when the store
	// hands the number to another label set (it was collected while this
	// node could not say it still used it), the local users still mean
	// these labels, and must be told to re-resolve (Revoke).
	bound      map[NumericIdentity]string
	generation uint64
	listeners  []func(added, deleted []Identity)
	refFns     []func(NumericIdentity)
	revokeFns  []func(NumericIdentity, []string)
}

// NewClusterCache returns an empty cache.
func NewClusterCache() *ClusterCache {
	return &ClusterCache{byID: map[NumericIdentity][]string{}, byKey: map[string]NumericIdentity{},
		refs: map[NumericIdentity]int{}, bound: map[NumericIdentity]string{}}
}

func (c *ClusterCache) notify(added, deleted []Identity) {
	c.mu.Lock()
	ls := append([]func(added, deleted []Identity){}, c.listeners...)
	c.mu.Unlock()
	for _, fn := range ls {
		fn(added, deleted)
	}
}

// Learn records id → labels and tells the listeners when it is new or
// its labels changed.
func (c *ClusterCache) Learn(id NumericIdentity, labels []string) {
	c.mu.Lock()
	if cur, ok := c.byID[id]; ok && LabelsKey(cur) == LabelsKey(labels) {
		c.mu.Unlock()
		return
	}
	if cur, ok := c.byID[id]; ok && c.byKey[LabelsKey(cur)] == id {
		// The number now stands for other labels: the old ones no
		// longer map to it.
		delete(c.byKey, LabelsKey(cur))
	}
	c.byID[id] = labels
	c.byKey[LabelsKey(labels)] = id
	c.generation++
	c.mu.Unlock()
	c.notify([]Identity{{ID: id, Labels: labels}}, nil)
}

// Forget drops an identity the store says is gone. A local reference
// keeps it: an endpoint still uses the number.
func (c *ClusterCache) Forget(id NumericIdentity) {
	c.mu.Lock()
	labels, ok := c.byID[id]
	if !ok || c.refs[id] > 0 {
		c.mu.Unlock()
		return
	}
	delete(c.byID, id)
	if c.byKey[LabelsKey(labels)] == id {
		delete(c.byKey, LabelsKey(labels))
	}
	c.generation++
	c.mu.Unlock()
	c.notify(nil, []Identity{{ID: id, Labels: labels}})
}

// KnownID returns the identity of a labels key, if known.
func (c *ClusterCache) KnownID(key string) (NumericIdentity, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	id, ok := c.byKey[key]
	return id, ok
}

// LabelsOf returns the labels of a known identity.
func (c *ClusterCache) LabelsOf(id NumericIdentity) ([]string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.byID[id]
	return l, ok
}

// Ref takes a local reference for the labels id is known by and returns
// the new count.
func (c *ClusterCache) Ref(id NumericIdentity) int {
	labels, _ := c.LabelsOf(id)
	return c.RefAs(id, labels)
}

// RefAs takes a local reference on id for labels and returns the new
// count. When the node holds id for other labels (the store gave the
// number to another label set since), those references are revoked
// first: one number stands for one label set on this node.
func (c *ClusterCache) RefAs(id NumericIdentity, labels []string) int {
	key := LabelsKey(labels)
	c.mu.Lock()
	if prev, ok := c.bound[id]; ok && prev != key {
		c.mu.Unlock()
		c.Revoke(id, prev)
		c.mu.Lock()
	}
	c.refs[id]++
	c.bound[id] = key
	n := c.refs[id]
	c.mu.Unlock()
	c.referencesChanged(id)
	return n
}

// BoundLabels returns the labels key a locally referenced identity is
// referenced for.
func (c *ClusterCache) BoundLabels(id NumericIdentity) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	key, ok := c.bound[id]
	return key, ok
}

// Held returns every locally referenced identity with the labels key it
// is referenced for, by ID.
func (c *ClusterCache) Held() []HeldIdentity {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]HeldIdentity, 0, len(c.bound))
	for id, key := range c.bound {
		out = append(out, HeldIdentity{ID: id, LabelsKey: key, Refs: c.refs[id]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// HeldIdentity is a locally referenced identity.
type HeldIdentity struct {
	ID        NumericIdentity
	LabelsKey string
	Refs      int
}

// Revoke drops every local reference on id held for the labels key (it
// does nothing when id is not held for them) and tells the revocation
// subscribers, whose users of id must resolve their labels again: the
// cluster no longer gives id to these labels. It reports whether it
// revoked.
func (c *ClusterCache) Revoke(id NumericIdentity, key string) bool {
	c.mu.Lock()
	if c.bound[id] != key {
		c.mu.Unlock()
		return false
	}
	delete(c.bound, id)
	delete(c.refs, id)
	if c.byKey[key] == id {
		delete(c.byKey, key)
	}
	fns := append(([]func(NumericIdentity, []string))(nil), c.revokeFns...)
	c.mu.Unlock()
	c.referencesChanged(id)
	labels := SplitLabelsKey(key)
	for _, fn := range fns {
		fn(id, labels)
	}
	return true
}

// SubscribeRevoked calls fn after the local references on id for labels
// were revoked.
func (c *ClusterCache) SubscribeRevoked(fn func(id NumericIdentity, labels []string)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.revokeFns = append(c.revokeFns, fn)
}

// Unref drops a local reference; last says it was the last one.
func (c *ClusterCache) Unref(id NumericIdentity) (last bool, err error) {
	c.mu.Lock()
	if c.refs[id] == 0 {
		c.mu.Unlock()
		return false, errNotHeld(id)
	}
	c.refs[id]--
	if c.refs[id] == 0 {
		delete(c.refs, id)
		delete(c.bound, id)
		last = true
	}
	c.mu.Unlock()
	c.referencesChanged(id)
	return last, nil
}

// SubscribeReferences calls fn after id's local references changed.
func (c *ClusterCache) SubscribeReferences(fn func(NumericIdentity)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refFns = append(c.refFns, fn)
}

func (c *ClusterCache) referencesChanged(id NumericIdentity) {
	c.mu.Lock()
	fns := append(([]func(NumericIdentity))(nil), c.refFns...)
	c.mu.Unlock()
	for _, fn := range fns {
		fn(id)
	}
}

// Lookup returns a known identity.
func (c *ClusterCache) Lookup(id NumericIdentity) (Identity, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	labels, ok := c.byID[id]
	if !ok {
		return Identity{}, false
	}
	return Identity{ID: id, Labels: labels, RefCount: c.refs[id]}, true
}

// List returns every known identity, by ID.
func (c *ClusterCache) List() []Identity {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Identity, 0, len(c.byID))
	for id, labels := range c.byID {
		out = append(out, Identity{ID: id, Labels: labels, RefCount: c.refs[id]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Generation changes whenever identities are added or removed.
func (c *ClusterCache) Generation() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.generation
}

// Subscribe calls fn after identities are added or removed.
func (c *ClusterCache) Subscribe(fn func(added, deleted []Identity)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.listeners = append(c.listeners, fn)
}
