// Package ipcache maps IP prefixes to security identities (and the node
// that owns them) for the datapath. Many claims may name one prefix: each
// comes from one owner (the object it was learned from: a local endpoint, a
// Node, a TendrilEndpoint, a kvstore key, a policy CIDR) in one source. The
// source of highest precedence wins (a local endpoint over Kubernetes over
// the kvstore over prefixes generated for policy), so a policy CIDR equal to
// a pod's address never hides the pod's identity; among claims of one
// source the most recent one wins while it exists. Withdrawing a claim
// touches only its owner's: the prefix falls back to the best remaining
// claim, whatever order the owners' events came in. The effective entries
// are written to a Backend (the BPF ipcache map); a failed write stays
// pending and is retried.
package ipcache

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/tendril-net/tendril/pkg/identity"
)

// Source is the kind of origin of a claim; a higher value wins.
type Source int

// Sources, lowest precedence first.
const (
	// SourceGenerated: prefixes the agent derives (world, policy CIDRs).
	SourceGenerated Source = iota
	// SourceKVStore: other nodes' endpoints published in the kvstore.
	SourceKVStore
	// SourceKubernetes: other nodes' endpoints (TendrilEndpoints) and node
	// addresses learned from Kubernetes objects.
	SourceKubernetes
	// SourceLocal: this node's endpoints and addresses.
	SourceLocal
)

// Sources lists every source, lowest precedence first.
func Sources() []Source {
	return []Source{SourceGenerated, SourceKVStore, SourceKubernetes, SourceLocal}
}

func (s Source) String() string {
	switch s {
	case SourceGenerated:
		return "generated"
	case SourceKVStore:
		return "kvstore"
	case SourceKubernetes:
		return "kubernetes"
	case SourceLocal:
		return "local"
	}
	return fmt.Sprintf("source(%d)", int(s))
}

// Owner names the object a claim comes from, as kind/key ("node/node2",
// "endpoint/17"). Two objects never share an owner, so one object's delete
// cannot withdraw another's claim on the same prefix.
type Owner string

// Owners of the agent's claims.
const (
	// OwnerHost: the node's own addresses.
	OwnerHost Owner = "host"
	// OwnerWorld: the default routes, claimed as world.
	OwnerWorld Owner = "world"
)

// OwnerEndpoint is a local endpoint's owner.
func OwnerEndpoint(id uint16) Owner { return Owner("endpoint/" + strconv.Itoa(int(id))) }

// OwnerNode is a peer node's owner (its Node object).
func OwnerNode(name string) Owner { return Owner("node/" + name) }

// OwnerTendrilEndpoint is another node's endpoint published as a
// TendrilEndpoint.
func OwnerTendrilEndpoint(namespace, name string) Owner {
	return Owner("tendrilendpoint/" + namespace + "/" + name)
}

// OwnerKVStore is another node's endpoint address published under key in
// the kvstore.
func OwnerKVStore(key string) Owner { return Owner("kvstore/" + key) }

// OwnerPolicyCIDR is the claim of a prefix that policy rules select.
func OwnerPolicyCIDR(prefix netip.Prefix) Owner { return Owner("policy-cidr/" + prefix.String()) }

// Entry is one owner's claim on a prefix.
type Entry struct {
	Identity identity.NumericIdentity
	// HostIP is the node that owns the prefix (unset: this node or none).
	HostIP netip.Addr
	Source Source
	// Owner is the object the claim comes from; required.
	Owner Owner
	// Name and Namespace say which pod the claim is about, for display.
	Name, Namespace string
}

// Backend realizes effective entries (the BPF map).
type Backend interface {
	Upsert(prefix netip.Prefix, e Entry) error
	Delete(prefix netip.Prefix) error
}

// claimKey identifies one claim of a prefix.
type claimKey struct {
	source Source
	owner  Owner
}

// claim is a claim with the order it was first made in.
type claim struct {
	entry Entry
	seq   uint64
}

// IPCache holds every owner's claims and realizes the winners.
type IPCache struct {
	backend Backend
	log     *slog.Logger

	mu     sync.Mutex
	claims map[netip.Prefix]map[claimKey]claim
	// seq numbers claims in the order they were first made: of one
	// source's claims, the highest wins.
	seq      uint64
	realized map[netip.Prefix]Entry
	pending  map[netip.Prefix]bool
	kick     chan struct{}
}

// New returns an empty cache writing to backend.
func New(backend Backend, log *slog.Logger) *IPCache {
	return &IPCache{backend: backend, log: log,
		claims: map[netip.Prefix]map[claimKey]claim{}, realized: map[netip.Prefix]Entry{},
		pending: map[netip.Prefix]bool{}, kick: make(chan struct{}, 1)}
}

// Upsert records (or changes) e.Owner's claim in e.Source and realizes the
// prefix's winner. A claim keeps its place among its source's claims when
// its owner changes it: it is as recent as when it was first made, so a
// periodic resync of an old object does not take the prefix back from a
// newer one. An error means the backend write failed; it stays pending
// and is retried.
func (c *IPCache) Upsert(prefix netip.Prefix, e Entry) error {
	if e.Owner == "" {
		return fmt.Errorf("ipcache %s: claim in source %s without an owner", prefix, e.Source)
	}
	prefix = prefix.Masked()
	k := claimKey{e.Source, e.Owner}
	c.mu.Lock()
	m := c.claims[prefix]
	if m == nil {
		m = map[claimKey]claim{}
		c.claims[prefix] = m
	}
	cl, ok := m[k]
	if !ok {
		c.seq++
		cl.seq = c.seq
	}
	cl.entry = e
	m[k] = cl
	c.pending[prefix] = true
	c.mu.Unlock()
	return c.syncPrefix(prefix)
}

// Delete withdraws owner's claim in src; the best remaining claim, if any,
// takes over, else the prefix goes from the backend. Other owners' claims
// stay, whatever their source.
func (c *IPCache) Delete(prefix netip.Prefix, src Source, owner Owner) error {
	prefix = prefix.Masked()
	k := claimKey{src, owner}
	c.mu.Lock()
	m := c.claims[prefix]
	if _, ok := m[k]; !ok {
		c.mu.Unlock()
		return nil
	}
	delete(m, k)
	if len(m) == 0 {
		delete(c.claims, prefix)
	}
	c.pending[prefix] = true
	c.mu.Unlock()
	return c.syncPrefix(prefix)
}

// winner is the effective entry of a prefix: the claim of the highest
// source, of those the most recent.
func winner(m map[claimKey]claim) (Entry, bool) {
	var best claim
	found := false
	for k, cl := range m {
		if !found || k.source > best.entry.Source || (k.source == best.entry.Source && cl.seq > best.seq) {
			best, found = cl, true
		}
	}
	return best.entry, found
}

// Claims returns every claim of a prefix, the effective one first, then
// by precedence.
func (c *IPCache) Claims(prefix netip.Prefix) []Entry {
	c.mu.Lock()
	m := c.claims[prefix.Masked()]
	cls := make([]claim, 0, len(m))
	for _, cl := range m {
		cls = append(cls, cl)
	}
	c.mu.Unlock()
	sort.Slice(cls, func(i, j int) bool {
		if cls[i].entry.Source != cls[j].entry.Source {
			return cls[i].entry.Source > cls[j].entry.Source
		}
		return cls[i].seq > cls[j].seq
	})
	out := make([]Entry, len(cls))
	for i, cl := range cls {
		out[i] = cl.entry
	}
	return out
}

// syncPrefix writes the prefix's winner (or its removal) to the backend.
// The lock is held across the write so two writers of one prefix cannot
// realize them out of order.
func (c *IPCache) syncPrefix(prefix netip.Prefix) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.pending[prefix] {
		return nil
	}
	want, ok := winner(c.claims[prefix])
	cur, realized := c.realized[prefix]
	var err error
	switch {
	case ok && (!realized || cur != want):
		if err = c.backend.Upsert(prefix, want); err == nil {
			c.realized[prefix] = want
		}
	case !ok && realized:
		if err = c.backend.Delete(prefix); err == nil {
			delete(c.realized, prefix)
		}
	}
	if err != nil {
		select {
		case c.kick <- struct{}{}:
		default:
		}
		return fmt.Errorf("ipcache %s: %w", prefix, err)
	}
	delete(c.pending, prefix)
	return nil
}

// Sync retries every pending prefix once.
func (c *IPCache) Sync() error {
	c.mu.Lock()
	prefixes := make([]netip.Prefix, 0, len(c.pending))
	for p := range c.pending {
		prefixes = append(prefixes, p)
	}
	c.mu.Unlock()
	var errs []error
	for _, p := range prefixes {
		if err := c.syncPrefix(p); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Pending is the number of prefixes whose realization failed so far.
func (c *IPCache) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending)
}

// Run retries pending writes every interval (sooner after a failure
// signal) until ctx ends.
func (c *IPCache) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.kick:
			// Back off a little so a failing backend is not hammered.
			select {
			case <-ctx.Done():
				return
			case <-time.After(interval / 10):
			}
		}
		if c.Pending() == 0 {
			continue
		}
		if err := c.Sync(); err != nil {
			c.log.Warn("ipcache writes still failing; will retry", "pending", c.Pending(), "error", err)
		}
	}
}

// Lookup returns a prefix's effective entry.
func (c *IPCache) Lookup(prefix netip.Prefix) (Entry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return winner(c.claims[prefix.Masked()])
}

// Item is a prefix with its effective entry.
type Item struct {
	Prefix netip.Prefix
	Entry  Entry
}

// List returns every effective entry, by prefix.
func (c *IPCache) List() []Item {
	c.mu.Lock()
	out := make([]Item, 0, len(c.claims))
	for p, m := range c.claims {
		if e, ok := winner(m); ok {
			out = append(out, Item{Prefix: p, Entry: e})
		}
	}
	c.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i].Prefix, out[j].Prefix
		if a.Addr() != b.Addr() {
			return a.Addr().Less(b.Addr())
		}
		return a.Bits() < b.Bits()
	})
	return out
}
