// Package ipam hands out pod addresses from the node's IPv4 and IPv6 pod
// CIDRs (host-scope IPAM): the first usable address of each CIDR is the
// router IP of the host device; allocations are keyed by owner (pod
// namespace/name) so a retried request gets the same address; allocations
// made with an expiration are released unless an endpoint claims them in
// time; restored endpoints re-reserve their addresses before anything new is
// handed out.
package ipam

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net/netip"
	"sort"
	"sync"
	"time"
)

// Family is an address family.
type Family string

const (
	IPv4 Family = "ipv4"
	IPv6 Family = "ipv6"
)

// FamilyOf returns the family of an address.
func FamilyOf(ip netip.Addr) Family {
	if ip.Is4() || ip.Is4In6() {
		return IPv4
	}
	return IPv6
}

// maxPoolSize bounds a pool's bitmap: a larger CIDR (an IPv6 /64) hands out
// addresses from its first maxPoolSize addresses only.
const maxPoolSize = 1 << 16

// Errors callers tell apart.
var (
	ErrPoolExhausted    = errors.New("address pool exhausted")
	ErrAlreadyAllocated = errors.New("address already allocated")
	ErrNotAllocated     = errors.New("address not allocated")
	ErrOutOfRange       = errors.New("address not in a pod CIDR of this node")
	ErrFamilyDisabled   = errors.New("address family not enabled on this node")
	ErrReserved         = errors.New("address reserved")
	ErrExpirationUUID   = errors.New("expiration UUID does not match")
)

// Allocation is one handed-out address.
type Allocation struct {
	IP     netip.Addr `json:"ip"`
	Owner  string     `json:"owner"`
	Family Family     `json:"family"`
	// ExpirationUUID is set while the allocation may still expire.
	ExpirationUUID string    `json:"expiration-uuid,omitempty"`
	Expires        time.Time `json:"expires,omitempty"`
	// Claimed is set once an endpoint holds the address.
	Claimed bool `json:"claimed,omitempty"`
}

// Config configures expiration.
type Config struct {
	// ExpirationTimeout is how long an allocation made with expiration may
	// stay unclaimed.
	ExpirationTimeout time.Duration
}

// DefaultConfig returns the defaults (Cilium's ten minutes).
func DefaultConfig() Config { return Config{ExpirationTimeout: 10 * time.Minute} }

// IPAM is the allocator of one node.
type IPAM struct {
	cfg Config
	log *slog.Logger
	now func() time.Time

	mu    sync.Mutex
	pools map[Family]*pool
}

// New returns an allocator over the given CIDRs; an invalid (zero) prefix
// disables its family. At least one family must be enabled.
func New(cfg Config, log *slog.Logger, v4, v6 netip.Prefix) (*IPAM, error) {
	if cfg.ExpirationTimeout <= 0 {
		cfg.ExpirationTimeout = DefaultConfig().ExpirationTimeout
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &IPAM{cfg: cfg, log: log, now: time.Now, pools: map[Family]*pool{}}
	if v4.IsValid() {
		if !v4.Addr().Is4() {
			return nil, fmt.Errorf("ipv4 pod CIDR %s is not IPv4", v4)
		}
		p, err := newPool(IPv4, v4)
		if err != nil {
			return nil, err
		}
		m.pools[IPv4] = p
	}
	if v6.IsValid() {
		if !v6.Addr().Is6() || v6.Addr().Is4In6() {
			return nil, fmt.Errorf("ipv6 pod CIDR %s is not IPv6", v6)
		}
		p, err := newPool(IPv6, v6)
		if err != nil {
			return nil, err
		}
		m.pools[IPv6] = p
	}
	if len(m.pools) == 0 {
		return nil, errors.New("ipam: no pod CIDR given")
	}
	return m, nil
}

// SetClock replaces the clock (tests).
func (m *IPAM) SetClock(now func() time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.now = now
}

// Enabled reports whether the family has a pool.
func (m *IPAM) Enabled(f Family) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pools[f] != nil
}

// CIDR returns the family's pod CIDR (invalid when disabled).
func (m *IPAM) CIDR(f Family) netip.Prefix {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p := m.pools[f]; p != nil {
		return p.prefix
	}
	return netip.Prefix{}
}

// RouterIP returns the family's router address (invalid when disabled).
func (m *IPAM) RouterIP(f Family) netip.Addr {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p := m.pools[f]; p != nil {
		return p.router
	}
	return netip.Addr{}
}

// AllocateNext hands out a free address of the family to owner; an owner
// that already holds one of that family gets the same address again.
func (m *IPAM) AllocateNext(f Family, owner string) (Allocation, error) {
	return m.allocateNext(f, owner, false)
}

// AllocateNextWithExpiration is AllocateNext whose result is released after
// the expiration timeout unless StopExpiration is called with its UUID.
func (m *IPAM) AllocateNextWithExpiration(f Family, owner string) (Allocation, error) {
	return m.allocateNext(f, owner, true)
}

func (m *IPAM) allocateNext(f Family, owner string, expire bool) (Allocation, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.pools[f]
	if p == nil {
		return Allocation{}, fmt.Errorf("allocate %s for %q: %w", f, owner, ErrFamilyDisabled)
	}
	if owner != "" {
		// A retried request (a CNI ADD that failed after allocating) gets
		// the owner's address again while no endpoint has claimed it; once
		// claimed, the address belongs to that endpoint and a new request of
		// the same owner (a pod re-created before the old sandbox's DEL)
		// gets a new one, so two endpoints never share an address.
		if ip, ok := p.byOwner[owner]; ok {
			if a := p.allocs[ip]; !a.Claimed {
				if expire {
					if a.ExpirationUUID == "" {
						a.ExpirationUUID = newUUID()
					}
					a.Expires = m.now().Add(m.cfg.ExpirationTimeout)
				}
				return *a, nil
			}
		}
	}
	idx, ok := p.nextFree()
	if !ok {
		return Allocation{}, fmt.Errorf("allocate %s for %q: %w: %s has no free address (%d in use)", f, owner, ErrPoolExhausted, p.prefix, p.used)
	}
	a := p.take(idx, owner)
	if expire {
		m.setExpiration(a)
	}
	return *a, nil
}

func (m *IPAM) setExpiration(a *Allocation) {
	a.ExpirationUUID = newUUID()
	a.Expires = m.now().Add(m.cfg.ExpirationTimeout)
}

// Allocate reserves a specific address for owner. Reserving an address the
// same owner already holds succeeds.
func (m *IPAM) Allocate(ip netip.Addr, owner string) (Allocation, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, idx, err := m.locate(ip)
	if err != nil {
		return Allocation{}, fmt.Errorf("allocate %s for %q: %w", ip, owner, err)
	}
	if a, ok := p.allocs[ip]; ok {
		if a.Owner == owner && owner != "" {
			return *a, nil
		}
		return Allocation{}, fmt.Errorf("allocate %s for %q: %w (owner %q)", ip, owner, ErrAlreadyAllocated, a.Owner)
	}
	if owner != "" {
		if held, ok := p.byOwner[owner]; ok {
			return Allocation{}, fmt.Errorf("allocate %s for %q: owner already holds %s", ip, owner, held)
		}
	}
	return *p.take(idx, owner), nil
}

// Restore re-reserves the address of a restored endpoint, claimed by it,
// with a clear error when two endpoints claim one address.
func (m *IPAM) Restore(ip netip.Addr, owner string) error {
	if _, err := m.Allocate(ip, owner); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	return m.Claim(ip, "")
}

// Claim marks an address as held by an endpoint: its expiration stops (uuid
// must match when one is pending) and its owner's next request gets a new
// address.
func (m *IPAM) Claim(ip netip.Addr, uuid string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	ip = ip.Unmap()
	p := m.pools[FamilyOf(ip)]
	if p == nil {
		return fmt.Errorf("claim %s: %w", ip, ErrFamilyDisabled)
	}
	a, ok := p.allocs[ip]
	if !ok {
		return fmt.Errorf("claim %s: %w", ip, ErrNotAllocated)
	}
	if a.ExpirationUUID != "" && uuid != "" && a.ExpirationUUID != uuid {
		return fmt.Errorf("claim %s: %w", ip, ErrExpirationUUID)
	}
	a.ExpirationUUID, a.Expires, a.Claimed = "", time.Time{}, true
	return nil
}

// locate finds the pool and bitmap index of ip.
func (m *IPAM) locate(ip netip.Addr) (*pool, uint64, error) {
	ip = ip.Unmap()
	p := m.pools[FamilyOf(ip)]
	if p == nil {
		return nil, 0, ErrFamilyDisabled
	}
	idx, ok := p.index(ip)
	if !ok {
		if ip == p.router {
			return nil, 0, fmt.Errorf("%w: %s is the router IP", ErrReserved, ip)
		}
		return nil, 0, fmt.Errorf("%w (%s)", ErrOutOfRange, p.prefix)
	}
	return p, idx, nil
}

// Release gives an address back.
func (m *IPAM) Release(ip netip.Addr) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	ip = ip.Unmap()
	p, idx, err := m.locate(ip)
	if err != nil {
		return fmt.Errorf("release %s: %w", ip, err)
	}
	if _, ok := p.allocs[ip]; !ok {
		return fmt.Errorf("release %s: %w", ip, ErrNotAllocated)
	}
	p.free(idx, ip)
	return nil
}

// ReleaseUnclaimed releases ip only while it is allocated to owner and no
// endpoint has claimed it, and reports whether it did. A failed CNI ADD
// gives its addresses back with it: by the time it rolls back, an endpoint
// deletion may already have released them and another pod been given one,
// and that pod's address must stay.
func (m *IPAM) ReleaseUnclaimed(ip netip.Addr, owner string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ip = ip.Unmap()
	p, idx, err := m.locate(ip)
	if err != nil {
		return false, fmt.Errorf("release %s: %w", ip, err)
	}
	a, ok := p.allocs[ip]
	if !ok || a.Owner != owner || a.Claimed {
		return false, nil
	}
	p.free(idx, ip)
	return true, nil
}

// ReleaseOwner releases every address owner holds and returns them.
func (m *IPAM) ReleaseOwner(owner string) []netip.Addr {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []netip.Addr
	for _, p := range m.pools {
		if ip, ok := p.byOwner[owner]; ok {
			idx, _ := p.index(ip)
			p.free(idx, ip)
			out = append(out, ip)
		}
	}
	return out
}

// StopExpiration claims an allocation made with expiration: it will no
// longer be released by the expiry. uuid must match.
func (m *IPAM) StopExpiration(ip netip.Addr, uuid string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	ip = ip.Unmap()
	p := m.pools[FamilyOf(ip)]
	if p == nil {
		return fmt.Errorf("stop expiration of %s: %w", ip, ErrFamilyDisabled)
	}
	a, ok := p.allocs[ip]
	if !ok {
		return fmt.Errorf("stop expiration of %s: %w", ip, ErrNotAllocated)
	}
	if a.ExpirationUUID == "" {
		return nil
	}
	if a.ExpirationUUID != uuid {
		return fmt.Errorf("stop expiration of %s: %w", ip, ErrExpirationUUID)
	}
	a.ExpirationUUID, a.Expires = "", time.Time{}
	return nil
}

// ReleaseExpired releases every allocation whose expiration has passed and
// returns them.
func (m *IPAM) ReleaseExpired() []Allocation {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	var out []Allocation
	for _, p := range m.pools {
		for ip, a := range p.allocs {
			if a.ExpirationUUID != "" && !now.Before(a.Expires) {
				out = append(out, *a)
				idx, _ := p.index(ip)
				p.free(idx, ip)
			}
		}
	}
	for _, a := range out {
		m.log.Info("Released an unclaimed address after its expiration", "ip", a.IP, "owner", a.Owner)
	}
	return out
}

// RunExpiration releases expired allocations every interval until ctx ends.
func (m *IPAM) RunExpiration(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.ReleaseExpired()
		}
	}
}

// Lookup returns the allocation of ip.
func (m *IPAM) Lookup(ip netip.Addr) (Allocation, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ip = ip.Unmap()
	if p := m.pools[FamilyOf(ip)]; p != nil {
		if a, ok := p.allocs[ip]; ok {
			return *a, true
		}
	}
	return Allocation{}, false
}

// PoolUsage is one family's usage.
type PoolUsage struct {
	Family      Family       `json:"family"`
	CIDR        netip.Prefix `json:"cidr"`
	Router      netip.Addr   `json:"router"`
	Used        int          `json:"used"`
	Total       int          `json:"total"`
	Allocations []Allocation `json:"allocations"`
}

// Usage returns each family's usage, allocations sorted by address.
func (m *IPAM) Usage() []PoolUsage {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []PoolUsage
	for _, f := range []Family{IPv4, IPv6} {
		p := m.pools[f]
		if p == nil {
			continue
		}
		u := PoolUsage{Family: f, CIDR: p.prefix, Router: p.router, Used: p.used, Total: int(p.size - p.reservedCount)}
		for _, a := range p.allocs {
			u.Allocations = append(u.Allocations, *a)
		}
		sort.Slice(u.Allocations, func(i, j int) bool { return u.Allocations[i].IP.Less(u.Allocations[j].IP) })
		out = append(out, u)
	}
	return out
}

// pool is one CIDR's bitmap allocator. Bit i stands for base+i.
type pool struct {
	family        Family
	prefix        netip.Prefix
	base          netip.Addr
	router        netip.Addr
	size          uint64
	reservedCount uint64
	bits          []uint64
	reserved      []uint64 // network, router, broadcast: never handed out
	next          uint64   // where the search for a free bit starts
	used          int
	allocs        map[netip.Addr]*Allocation
	byOwner       map[string]netip.Addr
}

func newPool(f Family, prefix netip.Prefix) (*pool, error) {
	prefix = prefix.Masked()
	hostBits := prefix.Addr().BitLen() - prefix.Bits()
	if hostBits < 2 {
		return nil, fmt.Errorf("%s pod CIDR %s is too small: need at least 4 addresses", f, prefix)
	}
	size := uint64(maxPoolSize)
	if hostBits < 16 {
		size = 1 << hostBits
	}
	p := &pool{
		family: f, prefix: prefix, base: prefix.Addr(), size: size,
		bits: make([]uint64, (size+63)/64), reserved: make([]uint64, (size+63)/64),
		allocs: map[netip.Addr]*Allocation{}, byOwner: map[string]netip.Addr{},
	}
	p.reserve(0) // network address (IPv6: the subnet-router anycast address)
	p.reserve(1) // router IP
	p.router = p.addr(1)
	if f == IPv4 && size == 1<<hostBits {
		p.reserve(size - 1) // broadcast
	}
	p.next = 2
	return p, nil
}

func (p *pool) reserve(i uint64) {
	p.reserved[i/64] |= 1 << (i % 64)
	p.bits[i/64] |= 1 << (i % 64)
	p.reservedCount++
}

func (p *pool) addr(i uint64) netip.Addr {
	b := new(big.Int).SetBytes(p.base.AsSlice())
	b.Add(b, new(big.Int).SetUint64(i))
	buf := make([]byte, p.base.BitLen()/8)
	b.FillBytes(buf)
	a, _ := netip.AddrFromSlice(buf)
	return a
}

// index returns the bit of ip, false when ip is outside the pool or reserved.
func (p *pool) index(ip netip.Addr) (uint64, bool) {
	if !p.prefix.Contains(ip) {
		return 0, false
	}
	d := new(big.Int).Sub(new(big.Int).SetBytes(ip.AsSlice()), new(big.Int).SetBytes(p.base.AsSlice()))
	if !d.IsUint64() || d.Uint64() >= p.size {
		return 0, false
	}
	i := d.Uint64()
	if p.reserved[i/64]&(1<<(i%64)) != 0 {
		return 0, false
	}
	return i, true
}

// nextFree finds a free bit from the cursor on, wrapping once, so
// consecutive allocations are O(1) amortized and a released address is not
// reused at once (which would confuse conntrack and observers).
func (p *pool) nextFree() (uint64, bool) {
	words := uint64(len(p.bits))
	start := p.next / 64
	for n := uint64(0); n <= words; n++ {
		w := (start + n) % words
		free := ^p.bits[w]
		if n == 0 {
			// Skip the bits before the cursor in the first word.
			free &= ^uint64(0) << (p.next % 64)
		}
		for free != 0 {
			bit := uint64(trailingZeros(free))
			i := w*64 + bit
			if i < p.size {
				return i, true
			}
			free &= free - 1
		}
	}
	// The first word's low bits, skipped above.
	for i := uint64(0); i < p.next%64 && i < p.size; i++ {
		if p.bits[start]&(1<<i) == 0 {
			return start*64 + i, true
		}
	}
	return 0, false
}

func trailingZeros(x uint64) int {
	n := 0
	for x&1 == 0 {
		x >>= 1
		n++
	}
	return n
}

func (p *pool) take(i uint64, owner string) *Allocation {
	p.bits[i/64] |= 1 << (i % 64)
	p.next = (i + 1) % p.size
	p.used++
	ip := p.addr(i)
	a := &Allocation{IP: ip, Owner: owner, Family: p.family}
	p.allocs[ip] = a
	if owner != "" {
		p.byOwner[owner] = ip
	}
	return a
}

func (p *pool) free(i uint64, ip netip.Addr) {
	p.bits[i/64] &^= 1 << (i % 64)
	p.used--
	if a, ok := p.allocs[ip]; ok && a.Owner != "" && p.byOwner[a.Owner] == ip {
		delete(p.byOwner, a.Owner)
	}
	delete(p.allocs, ip)
}

// newUUID returns a random RFC 4122 version 4 UUID.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = (b[6] & 0x0f) | 0x40
	b[8] = (b[8] & 0x3f) | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
