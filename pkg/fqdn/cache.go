// Package fqdn keeps what the node's DNS proxy learned: for each endpoint,
// the names it looked up and the addresses answered, each until its TTL
// (never shorter than a minimum) runs out. toFQDNs selectors select the
// CIDR identities of these addresses. The cache is saved in the agent's
// state directory and restored at start, so the names a pod learned stay
// allowed across an agent restart.
package fqdn

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/tendril-net/tendril/pkg/policy/api"
)

// Lookup is one name an endpoint looked up, with the addresses answered.
type Lookup struct {
	EndpointID uint16       `json:"endpointID"`
	Name       string       `json:"name"` // normalized: lower case, no trailing dot
	IPs        []netip.Addr `json:"ips"`
	TTL        uint32       `json:"ttl"` // the TTL used (after the minimum)
	LookupTime time.Time    `json:"lookupTime"`
	Expires    time.Time    `json:"expires"`
}

type cacheKey struct {
	ep   uint16
	name string
}

// Cache holds the unexpired lookups. Safe for concurrent use.
type Cache struct {
	minTTL time.Duration
	now    func() time.Time

	mu      sync.Mutex
	lookups map[cacheKey]*Lookup
}

// NewCache returns an empty cache whose entries live at least minTTL.
func NewCache(minTTL time.Duration, now func() time.Time) *Cache {
	if now == nil {
		now = time.Now
	}
	return &Cache{minTTL: minTTL, now: now, lookups: map[cacheKey]*Lookup{}}
}

// Add records an answer: the addresses join those already known for the
// endpoint's name, and the entry lives for ttl seconds (at least the
// minimum) from now. It reports whether an address is new.
func (c *Cache) Add(ep uint16, name string, ips []netip.Addr, ttl uint32) (added bool) {
	now := c.now()
	d := time.Duration(ttl) * time.Second
	if d < c.minTTL {
		d = c.minTTL
		ttl = uint32(c.minTTL / time.Second)
	}
	k := cacheKey{ep, api.NormalizeName(name)}
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.lookups[k]
	if !ok || !now.Before(l.Expires) {
		l = &Lookup{EndpointID: ep, Name: k.name}
		c.lookups[k] = l
	}
	for _, ip := range ips {
		ip = ip.Unmap()
		if !slices.Contains(l.IPs, ip) {
			l.IPs = append(l.IPs, ip)
			added = true
		}
	}
	slices.SortFunc(l.IPs, func(a, b netip.Addr) int { return a.Compare(b) })
	l.LookupTime, l.TTL = now, ttl
	if exp := now.Add(d); exp.After(l.Expires) {
		l.Expires = exp
	}
	return added
}

// Expire drops the entries whose time is up and reports whether any went.
func (c *Cache) Expire() bool {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	gone := false
	for k, l := range c.lookups {
		if !now.Before(l.Expires) {
			delete(c.lookups, k)
			gone = true
		}
	}
	return gone
}

// Lookups lists the unexpired entries, of one endpoint when ep is not 0,
// whose name matches pattern when it is not empty (the FQDNSelector
// matchPattern syntax), sorted by endpoint and name.
func (c *Cache) Lookups(ep uint16, pattern string) []Lookup {
	sel := api.FQDNSelector{MatchPattern: pattern}
	now := c.now()
	c.mu.Lock()
	var out []Lookup
	for k, l := range c.lookups {
		if (ep != 0 && k.ep != ep) || !now.Before(l.Expires) || (pattern != "" && !sel.Matches(k.name)) {
			continue
		}
		cp := *l
		cp.IPs = slices.Clone(l.IPs)
		out = append(out, cp)
	}
	c.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].EndpointID != out[j].EndpointID {
			return out[i].EndpointID < out[j].EndpointID
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// Delete removes the entries of one endpoint (all when ep is 0) whose
// name matches pattern (all when empty), and reports how many went.
func (c *Cache) Delete(ep uint16, pattern string) int {
	sel := api.FQDNSelector{MatchPattern: pattern}
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for k := range c.lookups {
		if (ep == 0 || k.ep == ep) && (pattern == "" || sel.Matches(k.name)) {
			delete(c.lookups, k)
			n++
		}
	}
	return n
}

// Names maps each address to the names (sorted) any unexpired entry
// answered with it: what toFQDNs selectors are matched against.
func (c *Cache) Names() map[netip.Addr][]string {
	now := c.now()
	out := map[netip.Addr][]string{}
	c.mu.Lock()
	for k, l := range c.lookups {
		if !now.Before(l.Expires) {
			continue
		}
		for _, ip := range l.IPs {
			if !slices.Contains(out[ip], k.name) {
				out[ip] = append(out[ip], k.name)
			}
		}
	}
	c.mu.Unlock()
	for _, names := range out {
		sort.Strings(names)
	}
	return out
}

// stateFile is the cache's file in the state directory.
const stateFile = "fqdn-cache.json"

type savedCache struct {
	Version int      `json:"version"`
	Lookups []Lookup `json:"lookups"`
}

// Save writes the unexpired entries to dir, atomically (a reader or a
// crash sees the old file or the new one).
func (c *Cache) Save(dir string) error {
	data, err := json.Marshal(savedCache{Version: 1, Lookups: c.Lookups(0, "")})
	if err != nil {
		return fmt.Errorf("encode fqdn cache: %w", err)
	}
	tmp, err := os.CreateTemp(dir, stateFile+".*")
	if err != nil {
		return fmt.Errorf("save fqdn cache: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("save fqdn cache: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("save fqdn cache: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("save fqdn cache: %w", err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, stateFile)); err != nil {
		return fmt.Errorf("save fqdn cache: %w", err)
	}
	return nil
}

// Restore loads the entries saved in dir, keeping those unexpired and
// valid; a missing file is an empty cache. A corrupt file is an error
// (the caller logs it and starts empty: the names are learned again on
// the next lookups).
func (c *Cache) Restore(dir string) (int, error) {
	data, err := os.ReadFile(filepath.Join(dir, stateFile))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("restore fqdn cache: %w", err)
	}
	var saved savedCache
	if err := json.Unmarshal(data, &saved); err != nil {
		return 0, fmt.Errorf("restore fqdn cache: %w", err)
	}
	if saved.Version != 1 {
		return 0, fmt.Errorf("restore fqdn cache: version %d, want 1", saved.Version)
	}
	now := c.now()
	n := 0
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range saved.Lookups {
		name := api.NormalizeName(l.Name)
		if l.EndpointID == 0 || (api.FQDNSelector{MatchName: name}).Validate("name") != nil || !now.Before(l.Expires) {
			continue
		}
		ips := slices.DeleteFunc(slices.Clone(l.IPs), func(a netip.Addr) bool { return !a.IsValid() })
		if len(ips) == 0 {
			continue
		}
		cp := l
		cp.Name, cp.IPs = name, ips
		c.lookups[cacheKey{l.EndpointID, name}] = &cp
		n++
	}
	return n, nil
}
