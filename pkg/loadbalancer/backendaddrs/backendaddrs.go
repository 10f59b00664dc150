// Package backendaddrs names the service of a backend address: flows to
// a backend (after socket load-balancing, or a pod's own address) name
// the service that lists it. It follows the backends table and keeps one
// small map entry per address, port and protocol instead of a statedb
// index over the table: a non-unique index holds a copy of every
// backend's primary key in a radix tree, 12.6 MiB at 10,000 services of
// 10 backends (19 % of the load balancer's tables and state), where this
// map's entry is an 8-byte key (IPv4; 20 for IPv6) and a 4-byte service
// number.
package backendaddrs

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"github.com/cilium/statedb"

	"github.com/tendril-net/tendril/pkg/loadbalancer"
)

// key4 and key6 are an address, port and protocol: IPv4 (and
// IPv4-mapped IPv6, so both forms of one address are one key) in 8 bytes,
// IPv6 in 20. Most backends are IPv4, and their map slot is 12 bytes
// with the service number.
type key4 struct {
	addr  [4]byte
	port  uint16
	proto uint8
}

type key6 struct {
	addr  [16]byte
	port  uint16
	proto uint8
}

// addrs maps the addresses of one family to service numbers: one holds
// the addresses one service lists, more those two or more list (every
// one of them; sharing is rare); a present address is in exactly one of
// the two.
type addrs[K comparable] struct {
	one  map[K]uint32
	more map[K][]uint32
}

func newAddrs[K comparable]() addrs[K] {
	return addrs[K]{one: map[K]uint32{}, more: map[K][]uint32{}}
}

func (m *addrs[K]) len() int { return len(m.one) + len(m.more) }

// lookup returns the numbers of the services listing k.
func (m *addrs[K]) lookup(k K) (one uint32, more []uint32, ok bool) {
	if id, ok := m.one[k]; ok {
		return id, nil, true
	}
	more, ok = m.more[k]
	return 0, more, ok
}

// add records that service id lists k and says whether it did not yet.
func (m *addrs[K]) add(k K, id uint32) bool {
	if ids, ok := m.more[k]; ok {
		if slices.Contains(ids, id) {
			return false
		}
		m.more[k] = append(ids, id)
		return true
	}
	if first, ok := m.one[k]; ok {
		if first == id {
			return false
		}
		delete(m.one, k)
		m.more[k] = []uint32{first, id}
		return true
	}
	m.one[k] = id
	return true
}

// remove records that service id no longer lists k and says whether it
// did.
func (m *addrs[K]) remove(k K, id uint32) bool {
	if ids, ok := m.more[k]; ok {
		i := slices.Index(ids, id)
		if i < 0 {
			return false
		}
		ids = slices.Delete(ids, i, i+1)
		if len(ids) == 1 {
			delete(m.more, k)
			m.one[k] = ids[0]
		} else {
			m.more[k] = ids
		}
		return true
	}
	if first, ok := m.one[k]; ok && first == id {
		delete(m.one, k)
		return true
	}
	return false
}

// Index maps backend addresses to the services listing them. The zero
// value is not usable: New makes one.
type Index struct {
	mu sync.RWMutex
	v4 addrs[key4]
	v6 addrs[key6]
	// Services are numbered: ids by name, names and refs (addresses
	// naming each) by number, free numbers for reuse.
	ids   map[loadbalancer.ServiceName]uint32
	names []loadbalancer.ServiceName
	refs  []uint32
	free  []uint32
}

// New returns an empty index.
func New() *Index {
	return &Index{v4: newAddrs[key4](), v6: newAddrs[key6](), ids: map[loadbalancer.ServiceName]uint32{}}
}

// ServiceOf names a service listing a backend at a, proto; of several,
// the first by namespace and name.
func (x *Index) ServiceOf(a netip.AddrPort, proto uint8) (loadbalancer.ServiceName, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	var (
		one  uint32
		more []uint32
		ok   bool
	)
	if ip := a.Addr().Unmap(); ip.Is4() {
		one, more, ok = x.v4.lookup(key4{addr: ip.As4(), port: a.Port(), proto: proto})
	} else {
		one, more, ok = x.v6.lookup(key6{addr: ip.As16(), port: a.Port(), proto: proto})
	}
	if !ok {
		return loadbalancer.ServiceName{}, false
	}
	if more == nil {
		return x.names[one], true
	}
	best := x.names[more[0]]
	for _, id := range more[1:] {
		if n := x.names[id]; compareNames(n, best) < 0 {
			best = n
		}
	}
	return best, true
}

func compareNames(a, b loadbalancer.ServiceName) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
}

// Len is the number of addresses the index names a service for.
func (x *Index) Len() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.v4.len() + x.v6.len()
}

// add records that svc lists a, proto; recording it twice is recording
// it once.
func (x *Index) add(a netip.AddrPort, proto uint8, svc loadbalancer.ServiceName) {
	id := x.number(svc)
	var added bool
	if ip := a.Addr().Unmap(); ip.Is4() {
		added = x.v4.add(key4{addr: ip.As4(), port: a.Port(), proto: proto}, id)
	} else {
		added = x.v6.add(key6{addr: ip.As16(), port: a.Port(), proto: proto}, id)
	}
	if added {
		x.refs[id]++
	}
}

// remove records that svc no longer lists a, proto (nothing when it did
// not).
func (x *Index) remove(a netip.AddrPort, proto uint8, svc loadbalancer.ServiceName) {
	id, ok := x.ids[svc]
	if !ok {
		return
	}
	var removed bool
	if ip := a.Addr().Unmap(); ip.Is4() {
		removed = x.v4.remove(key4{addr: ip.As4(), port: a.Port(), proto: proto}, id)
	} else {
		removed = x.v6.remove(key6{addr: ip.As16(), port: a.Port(), proto: proto}, id)
	}
	if removed {
		x.release(id)
	}
}

// number is svc's number, a new one (no references yet) when it has
// none.
func (x *Index) number(svc loadbalancer.ServiceName) uint32 {
	if id, ok := x.ids[svc]; ok {
		return id
	}
	var id uint32
	if n := len(x.free); n > 0 {
		id, x.free = x.free[n-1], x.free[:n-1]
		x.names[id] = svc
	} else {
		id = uint32(len(x.names))
		x.names = append(x.names, svc)
		x.refs = append(x.refs, 0)
	}
	x.ids[svc] = id
	return id
}

// release drops one reference to id; the last frees its number.
func (x *Index) release(id uint32) {
	x.refs[id]--
	if x.refs[id] == 0 {
		delete(x.ids, x.names[id])
		x.names[id] = loadbalancer.ServiceName{}
		x.free = append(x.free, id)
	}
}

// Follower brings an index up to date with the backends table.
type Follower struct {
	index    *Index
	db       *statedb.DB
	backends statedb.Table[*loadbalancer.Backend]
	changes  statedb.ChangeIterator[*loadbalancer.Backend]
}

// NewFollower starts tracking the backends table's changes (the rows
// already there first) for x.
func NewFollower(x *Index, db *statedb.DB, backends statedb.Table[*loadbalancer.Backend]) (*Follower, error) {
	wtxn := db.WriteTxn(backends)
	changes, err := backends.Changes(wtxn)
	wtxn.Commit()
	if err != nil {
		return nil, fmt.Errorf("follow the backends table: %w", err)
	}
	return &Follower{index: x, db: db, backends: backends, changes: changes}, nil
}

// Step applies the changes up to txn and returns a channel closed when
// there are more.
//
// A deleted row removes its address from its service only when no other
// row of that service (another source: a second EndpointSlice) lists the
// address in txn. That decides each address and service by its last
// change in the batch and the table at txn, so the index after a step is
// what txn holds.
func (f *Follower) Step(txn statedb.ReadTxn) <-chan struct{} {
	seq, watch := f.changes.Next(txn)
	x := f.index
	x.mu.Lock()
	defer x.mu.Unlock()
	for c := range seq {
		b := c.Object
		if !c.Deleted {
			x.add(b.Addr, b.Proto, b.Service)
			continue
		}
		if !f.listed(txn, b) {
			x.remove(b.Addr, b.Proto, b.Service)
		}
	}
	return watch
}

// listed says whether a row of b's service lists b's address, port and
// protocol in txn (a service's rows are a prefix of the primary index).
func (f *Follower) listed(txn statedb.ReadTxn, b *loadbalancer.Backend) bool {
	a := netip.AddrPortFrom(b.Addr.Addr().Unmap(), b.Addr.Port())
	for o := range loadbalancer.ServiceBackends(txn, f.backends, b.Service) {
		if o.Service == b.Service && o.Proto == b.Proto && netip.AddrPortFrom(o.Addr.Addr().Unmap(), o.Addr.Port()) == a {
			return true
		}
	}
	return false
}

// Run steps until ctx ends, then stops tracking.
func (f *Follower) Run(ctx context.Context) {
	defer f.changes.Close()
	for {
		watch := f.Step(f.db.ReadTxn())
		select {
		case <-ctx.Done():
			return
		case <-watch:
		}
	}
}
