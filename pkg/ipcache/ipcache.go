// Package ipcache maps IP prefixes to security identities (and the node
// that owns them) for the datapath. Several sources may claim a prefix;
// the one of highest precedence wins (a local endpoint over what
// Kubernetes or the kvstore says over prefixes generated for policy), so a
// policy CIDR equal to a pod's address never hides the pod's identity, and
// removing one source's claim reveals the next. The effective entries are
// written to a Backend (the BPF ipcache map); a failed write stays pending
// and is retried.
package ipcache

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sort"
	"sync"
	"time"

	"github.com/tendril-net/tendril/pkg/identity"
)

// Source is who claims a prefix; a higher value wins.
type Source int

// Sources, lowest precedence first.
const (
	// SourceGenerated: prefixes the agent derives (world, policy CIDRs).
	SourceGenerated Source = iota
	// SourceKubernetes: other nodes' endpoints and node addresses learned
	// from Kubernetes objects or the kvstore.
	SourceKubernetes
	// SourceLocal: this node's endpoints and addresses.
	SourceLocal
)

func (s Source) String() string {
	switch s {
	case SourceGenerated:
		return "generated"
	case SourceKubernetes:
		return "kubernetes"
	case SourceLocal:
		return "local"
	}
	return fmt.Sprintf("source(%d)", int(s))
}

// Entry is one source's claim on a prefix.
type Entry struct {
	Identity identity.NumericIdentity
	// HostIP is the node that owns the prefix (unset: this node or none).
	HostIP netip.Addr
	Source Source
	// Name and Namespace say which object the claim came from (a pod).
	Name, Namespace string
}

// Backend realizes effective entries (the BPF map).
type Backend interface {
	Upsert(prefix netip.Prefix, e Entry) error
	Delete(prefix netip.Prefix) error
}

// IPCache holds every source's claims and realizes the winners.
type IPCache struct {
	backend Backend
	log     *slog.Logger

	mu       sync.Mutex
	claims   map[netip.Prefix]map[Source]Entry
	realized map[netip.Prefix]Entry
	pending  map[netip.Prefix]bool
	kick     chan struct{}
}

// New returns an empty cache writing to backend.
func New(backend Backend, log *slog.Logger) *IPCache {
	return &IPCache{backend: backend, log: log,
		claims: map[netip.Prefix]map[Source]Entry{}, realized: map[netip.Prefix]Entry{},
		pending: map[netip.Prefix]bool{}, kick: make(chan struct{}, 1)}
}

// Upsert records a source's claim and realizes the prefix's winner. An
// error means the backend write failed; it stays pending and is retried.
func (c *IPCache) Upsert(prefix netip.Prefix, e Entry) error {
	prefix = prefix.Masked()
	c.mu.Lock()
	m := c.claims[prefix]
	if m == nil {
		m = map[Source]Entry{}
		c.claims[prefix] = m
	}
	m[e.Source] = e
	c.pending[prefix] = true
	c.mu.Unlock()
	return c.syncPrefix(prefix)
}

// Delete withdraws a source's claim; the next source's claim, if any,
// takes over, else the prefix goes from the backend.
func (c *IPCache) Delete(prefix netip.Prefix, src Source) error {
	prefix = prefix.Masked()
	c.mu.Lock()
	m := c.claims[prefix]
	if _, ok := m[src]; !ok {
		c.mu.Unlock()
		return nil
	}
	delete(m, src)
	if len(m) == 0 {
		delete(c.claims, prefix)
	}
	c.pending[prefix] = true
	c.mu.Unlock()
	return c.syncPrefix(prefix)
}

// winner is the effective entry of a prefix.
func winner(m map[Source]Entry) (Entry, bool) {
	best, found := Entry{}, false
	for s, e := range m {
		if !found || s > best.Source {
			best, found = e, true
		}
	}
	return best, found
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
