package maps

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
)

// Conntrack entry flags of CTEntry.Flags: CTFlagSeenReply and
// CTFlagClosing as stored (enums_gen.go), and these two, by Src and Dst
// where the map stores them by side of the key (CTFlagANotLocal,
// CTFlagBNotLocal, with CTFlagAStarted telling which side started).
const (
	// CTFlagSrcNotLocal (CTFlagDstNotLocal): the flow's source
	// (destination) was not a local endpoint when the entry was made, so
	// established packets towards it are not looked for among the local
	// endpoints.
	CTFlagSrcNotLocal uint8 = 0x20
	CTFlagDstNotLocal uint8 = 0x40
)

// CTEntry is one conntrack entry: a flow on this node, one entry for both
// directions and for its local endpoints (one, or two between local pods).
type CTEntry struct {
	Proto uint8
	// Src started the flow; Dst is its peer. For ICMP echo the ports are
	// (identifier, 0).
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
	// SrcEndpoint and DstEndpoint are the local endpoints owning Src and
	// Dst whose policy admitted the flow: 0 for a remote side, or for a
	// local endpoint that has not seen the flow yet (it treats the flow as
	// new).
	SrcEndpoint, DstEndpoint uint16
	// Expires is a CLOCK_MONOTONIC_COARSE deadline in ns (see MonotonicNow).
	Expires  uint64
	Flags    uint8 // CTFlagSeenReply, CTFlagClosing, CTFlagSrcNotLocal, CTFlagDstNotLocal
	TCPFlags uint8 // every TCP flag seen on the flow
	// RevNAT is the reverse NAT ID of a flow the per-packet service NAT
	// translated (Dst is then the backend); 0: not translated.
	RevNAT uint32
	// Proxy is the node's proxy (Proxy*) the flow's egress policy sent it
	// to (ProxyHttpIngress: the destination's ingress; ProxyHttpBoth: the
	// HTTP proxy for both the source's egress and the destination's
	// ingress rules); 0: none.
	Proxy uint8
	// SrcIdentity is the identity the datapath gave a remote Src whose
	// flow a local Dst's ingress sent to the HTTP proxy (from_netdev,
	// from_overlay: bpf/lib/l7ingress.h); 0 otherwise.
	SrcIdentity uint32
	// SrcRevoked and DstRevoked: the agent revoked the admission of the
	// local endpoint on that side (Revoke); its policy checks every
	// packet of the flow as new, and never admits it again.
	SrcRevoked, DstRevoked bool
}

// SeenReply reports whether the flow has been answered.
func (e CTEntry) SeenReply() bool { return e.Flags&CTFlagSeenReply != 0 }

// Closing reports a TCP flow that saw FIN or RST.
func (e CTEntry) Closing() bool { return e.Flags&CTFlagClosing != 0 }

// Origin is the direction, seen from endpoint id, of the flow's first
// packet (DirEgress when id started it), and whether id admitted the flow.
func (e CTEntry) Origin(id uint16) (dir uint8, ok bool) {
	switch {
	case id != 0 && e.SrcEndpoint == id:
		return DirEgress, true
	case id != 0 && e.DstEndpoint == id:
		return DirIngress, true
	}
	return 0, false
}

// MonotonicNow is the clock of CTEntry.Expires (the datapath's
// bpf_ktime_get_coarse_ns).
func MonotonicNow() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC_COARSE, &ts)
	return uint64(ts.Nano())
}

// CTMap is the conntrack table: one LRU hash per address family.
type CTMap struct{ v4, v6 *ebpf.Map }

// CTMapOf is the conntrack table held in the maps v4 (tdr_ct4_v2) and v6
// (tdr_ct6_v2), opened by the caller (the pinned maps, for a reader outside
// the datapath cell).
func CTMapOf(v4, v6 *ebpf.Map) CTMap { return CTMap{v4: v4, v6: v6} }

// srcIsA is the datapath's canonical order: side a of the key is the lower
// (address, port), addresses and then ports compared as big-endian
// numbers; a tie puts the source on side a.
func (e CTEntry) srcIsA() bool {
	c := e.Src.Unmap().Compare(e.Dst.Unmap())
	return c < 0 || (c == 0 && e.SrcPort <= e.DstPort)
}

func (e CTEntry) is4() (bool, error) {
	s, d := e.Src.Unmap(), e.Dst.Unmap()
	if !s.IsValid() || !d.IsValid() || s.Is4() != d.Is4() {
		return false, fmt.Errorf("conntrack entry %s -> %s: addresses of one family needed", e.Src, e.Dst)
	}
	return s.Is4(), nil
}

// sides returns the key's side a and b (address, port, endpoint).
func (e CTEntry) sides() (aAddr netip.Addr, aPort, aEP uint16, bAddr netip.Addr, bPort, bEP uint16) {
	if e.srcIsA() {
		return e.Src.Unmap(), e.SrcPort, e.SrcEndpoint, e.Dst.Unmap(), e.DstPort, e.DstEndpoint
	}
	return e.Dst.Unmap(), e.DstPort, e.DstEndpoint, e.Src.Unmap(), e.SrcPort, e.SrcEndpoint
}

func (e CTEntry) key4() bpf.LxcCt4Key {
	a, ap, _, b, bp, _ := e.sides()
	return bpf.LxcCt4Key{AddrA: a.As4(), AddrB: b.As4(), PortA: Htons(ap), PortB: Htons(bp), Proto: e.Proto}
}

func (e CTEntry) key6() bpf.LxcCt6Key {
	a, ap, _, b, bp, _ := e.sides()
	return bpf.LxcCt6Key{AddrA: a.As16(), AddrB: b.As16(), PortA: Htons(ap), PortB: Htons(bp), Proto: e.Proto}
}

func (e CTEntry) value() bpf.LxcCtEntry {
	_, _, aEP, _, _, bEP := e.sides()
	v := bpf.LxcCtEntry{Expires: e.Expires, EpA: aEP, EpB: bEP, Flags: e.Flags & (CTFlagSeenReply | CTFlagClosing), TcpFlags: e.TCPFlags, RevNat: e.RevNAT, Proxy: e.Proxy, SrcIdentity: e.SrcIdentity}
	srcFlag, dstFlag := CTFlagBNotLocal, CTFlagANotLocal
	if e.srcIsA() {
		v.Flags |= CTFlagAStarted
		srcFlag, dstFlag = CTFlagANotLocal, CTFlagBNotLocal
	}
	if e.Flags&CTFlagSrcNotLocal != 0 {
		v.Flags |= srcFlag
	}
	if e.Flags&CTFlagDstNotLocal != 0 {
		v.Flags |= dstFlag
	}
	srcRev, dstRev := CTRevokedB, CTRevokedA
	if e.srcIsA() {
		srcRev, dstRev = CTRevokedA, CTRevokedB
	}
	if e.SrcRevoked {
		v.Revoked |= srcRev
	}
	if e.DstRevoked {
		v.Revoked |= dstRev
	}
	return v
}

// fromRaw orients a stored entry: the side that started the flow is Src.
func fromRaw(proto uint8, a netip.Addr, aPort uint16, b netip.Addr, bPort uint16, v bpf.LxcCtEntry) CTEntry {
	e := CTEntry{Proto: proto, Expires: v.Expires, Flags: v.Flags & (CTFlagSeenReply | CTFlagClosing), TCPFlags: v.TcpFlags, RevNAT: v.RevNat, Proxy: v.Proxy, SrcIdentity: v.SrcIdentity}
	aStarted := v.Flags&CTFlagAStarted != 0
	if (v.Flags&CTFlagANotLocal != 0 && aStarted) || (v.Flags&CTFlagBNotLocal != 0 && !aStarted) {
		e.Flags |= CTFlagSrcNotLocal
	}
	if (v.Flags&CTFlagBNotLocal != 0 && aStarted) || (v.Flags&CTFlagANotLocal != 0 && !aStarted) {
		e.Flags |= CTFlagDstNotLocal
	}
	aRev, bRev := v.Revoked&CTRevokedA != 0, v.Revoked&CTRevokedB != 0
	if aStarted {
		e.Src, e.SrcPort, e.SrcEndpoint, e.Dst, e.DstPort, e.DstEndpoint = a, aPort, v.EpA, b, bPort, v.EpB
		e.SrcRevoked, e.DstRevoked = aRev, bRev
	} else {
		e.Src, e.SrcPort, e.SrcEndpoint, e.Dst, e.DstPort, e.DstEndpoint = b, bPort, v.EpB, a, aPort, v.EpA
		e.SrcRevoked, e.DstRevoked = bRev, aRev
	}
	return e
}

func fromKey4(k bpf.LxcCt4Key, v bpf.LxcCtEntry) CTEntry {
	return fromRaw(k.Proto, netip.AddrFrom4(k.AddrA), Ntohs(k.PortA), netip.AddrFrom4(k.AddrB), Ntohs(k.PortB), v)
}

func fromKey6(k bpf.LxcCt6Key, v bpf.LxcCtEntry) CTEntry {
	return fromRaw(k.Proto, netip.AddrFrom16(k.AddrA), Ntohs(k.PortA), netip.AddrFrom16(k.AddrB), Ntohs(k.PortB), v)
}

// Upsert writes an entry (tests, benchmarks and the upgrade from an older
// layout fill the table with it).
func (m CTMap) Upsert(e CTEntry) error {
	is4, err := e.is4()
	if err != nil {
		return err
	}
	v := e.value()
	if is4 {
		k := e.key4()
		err = m.v4.Put(&k, &v)
	} else {
		k := e.key6()
		err = m.v6.Put(&k, &v)
	}
	if err != nil {
		return fmt.Errorf("write conntrack entry %s:%d -> %s:%d proto %d: %w", e.Src, e.SrcPort, e.Dst, e.DstPort, e.Proto, err)
	}
	return nil
}

// Delete removes the entry of e's flow; a missing one is fine.
func (m CTMap) Delete(e CTEntry) error {
	is4, err := e.is4()
	if err != nil {
		return err
	}
	if is4 {
		k := e.key4()
		err = m.v4.Delete(&k)
	} else {
		k := e.key6()
		err = m.v6.Delete(&k)
	}
	if err := ignoreMissing(err); err != nil {
		return fmt.Errorf("delete conntrack entry: %w", err)
	}
	return nil
}

// Revoke takes endpoint id's admission of e's flow back: the side it is
// named on loses the name and is marked revoked, so the endpoint's
// policy checks every later packet of the flow as new and never admits
// it again (bpf/lib/conntrack.h, ct_admit). The entry itself stays, for
// the flow's other endpoint, and so that a packet the endpoint's policy
// lets through does not start the flow afresh with the endpoint admitted.
// It reports whether the entry was there and named id.
func (m CTMap) Revoke(e CTEntry, id uint16) (bool, error) {
	is4, err := e.is4()
	if err != nil {
		return false, err
	}
	var v bpf.LxcCtEntry
	var mp *ebpf.Map
	var key any
	if is4 {
		k := e.key4()
		mp, key = m.v4, &k
	} else {
		k := e.key6()
		mp, key = m.v6, &k
	}
	if err := mp.Lookup(key, &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return false, nil
		}
		return false, fmt.Errorf("look up conntrack entry %s:%d -> %s:%d: %w", e.Src, e.SrcPort, e.Dst, e.DstPort, err)
	}
	named := false
	if id != 0 && v.EpA == id {
		v.EpA, v.Revoked, named = 0, v.Revoked|CTRevokedA, true
	}
	if id != 0 && v.EpB == id {
		v.EpB, v.Revoked, named = 0, v.Revoked|CTRevokedB, true
	}
	if !named {
		return false, nil
	}
	// The datapath may have changed the deadline or flags since the
	// lookup: losing that update costs at most a refresh.
	if err := mp.Update(key, &v, ebpf.UpdateExist); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return false, nil
		}
		return false, fmt.Errorf("revoke conntrack entry %s:%d -> %s:%d of endpoint %d: %w", e.Src, e.SrcPort, e.Dst, e.DstPort, id, err)
	}
	return true, nil
}

// Lookup returns the entry of the flow with key's protocol, addresses and
// ports, in either direction (a reply's tuple finds its flow).
func (m CTMap) Lookup(key CTEntry) (CTEntry, bool, error) {
	is4, err := key.is4()
	if err != nil {
		return CTEntry{}, false, err
	}
	var v bpf.LxcCtEntry
	if is4 {
		k := key.key4()
		if err = m.v4.Lookup(&k, &v); err == nil {
			return fromKey4(k, v), true, nil
		}
	} else {
		k := key.key6()
		if err = m.v6.Lookup(&k, &v); err == nil {
			return fromKey6(k, v), true, nil
		}
	}
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return CTEntry{}, false, nil
	}
	return CTEntry{}, false, fmt.Errorf("look up conntrack entry: %w", err)
}

// Iterate calls fn for each entry, IPv4 first, until fn returns false.
func (m CTMap) Iterate(fn func(CTEntry) bool) error {
	var v bpf.LxcCtEntry
	var k4 bpf.LxcCt4Key
	it := m.v4.Iterate()
	for it.Next(&k4, &v) {
		if !fn(fromKey4(k4, v)) {
			return nil
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("iterate IPv4 conntrack: %w", err)
	}
	var k6 bpf.LxcCt6Key
	it = m.v6.Iterate()
	for it.Next(&k6, &v) {
		if !fn(fromKey6(k6, v)) {
			return nil
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("iterate IPv6 conntrack: %w", err)
	}
	return nil
}

// List returns every entry.
func (m CTMap) List() ([]CTEntry, error) {
	var out []CTEntry
	err := m.Iterate(func(e CTEntry) bool { out = append(out, e); return true })
	return out, err
}

// Count is the number of entries of both families.
func (m CTMap) Count() (int, error) {
	n4, err := countKeys(m.v4)
	if err != nil {
		return 0, err
	}
	n6, err := countKeys(m.v6)
	return n4 + n6, err
}

// Capacity is the two tables' maximum number of entries.
func (m CTMap) Capacity() int { return int(m.v4.MaxEntries() + m.v6.MaxEntries()) }

// SweepResult counts one sweep of the table.
type SweepResult struct {
	Seen, Deleted int
	// Forgotten counts entries kept for a live endpoint from which a
	// deleted endpoint's name was cleared.
	Forgotten int
}

// DeleteExpired deletes every entry whose deadline is before now (see
// MonotonicNow) and every entry that names no live endpoint (keep says
// whether an endpoint ID still exists; nil keeps all). An entry that
// names a live and a deleted endpoint stays, without the deleted one: a
// new endpoint that reuses the ID and an address must not inherit it.
//
// The host firewall's side of a flow (HostFirewallCTID) is always live: the
// host endpoint does not go away.
func (m CTMap) DeleteExpired(now uint64, keep func(epID uint16) bool) (SweepResult, error) {
	var res SweepResult
	if keep != nil {
		endpoint := keep
		keep = func(id uint16) bool { return id == HostFirewallCTID || endpoint(id) }
	}
	// verdict: 0 keep, 1 delete, 2 clear slots (returned in v).
	judge := func(v *bpf.LxcCtEntry) int {
		res.Seen++
		if v.Expires < now {
			return 1
		}
		if keep == nil {
			return 0
		}
		liveA := v.EpA != 0 && keep(v.EpA)
		liveB := v.EpB != 0 && keep(v.EpB)
		switch {
		case !liveA && !liveB:
			return 1
		case (v.EpA != 0 && !liveA) || (v.EpB != 0 && !liveB):
			if !liveA {
				v.EpA = 0
			}
			if !liveB {
				v.EpB = 0
			}
			return 2
		}
		return 0
	}
	var v bpf.LxcCtEntry
	var k4 bpf.LxcCt4Key
	var del4, fix4 []bpf.LxcCt4Key
	var fixV4 []bpf.LxcCtEntry
	it := m.v4.Iterate()
	for it.Next(&k4, &v) {
		switch judge(&v) {
		case 1:
			del4 = append(del4, k4)
		case 2:
			fix4, fixV4 = append(fix4, k4), append(fixV4, v)
		}
	}
	// An LRU table may evict under the walk, which then gives up; what
	// was found so far is still worth acting on.
	if err := it.Err(); err != nil && !errors.Is(err, ebpf.ErrIterationAborted) {
		return res, fmt.Errorf("walk IPv4 conntrack: %w", err)
	}
	var k6 bpf.LxcCt6Key
	var del6, fix6 []bpf.LxcCt6Key
	var fixV6 []bpf.LxcCtEntry
	it = m.v6.Iterate()
	for it.Next(&k6, &v) {
		switch judge(&v) {
		case 1:
			del6 = append(del6, k6)
		case 2:
			fix6, fixV6 = append(fix6, k6), append(fixV6, v)
		}
	}
	if err := it.Err(); err != nil && !errors.Is(err, ebpf.ErrIterationAborted) {
		return res, fmt.Errorf("walk IPv6 conntrack: %w", err)
	}
	res.Deleted += deleteKeys(m.v4, del4)
	res.Deleted += deleteKeys(m.v6, del6)
	res.Forgotten += updateExisting(m.v4, fix4, fixV4)
	res.Forgotten += updateExisting(m.v6, fix6, fixV6)
	return res, nil
}

// deleteKeys deletes in batches where the kernel supports it, one by one
// otherwise; it returns how many were deleted.
func deleteKeys[K any](m *ebpf.Map, keys []K) int {
	if len(keys) == 0 {
		return 0
	}
	if n, err := m.BatchDelete(keys, nil); err == nil {
		return n
	}
	deleted := 0
	for i := range keys {
		if err := m.Delete(&keys[i]); err == nil {
			deleted++
		}
	}
	return deleted
}

// updateExisting rewrites entries that still exist (an entry the datapath
// replaced or the LRU evicted meanwhile is left alone).
func updateExisting[K any](m *ebpf.Map, keys []K, values []bpf.LxcCtEntry) int {
	n := 0
	for i := range keys {
		if err := m.Update(&keys[i], &values[i], ebpf.UpdateExist); err == nil {
			n++
		}
	}
	return n
}

// DeleteEndpoint forgets endpoint id: entries naming only it are deleted,
// entries it shares with another endpoint lose its name.
func (m CTMap) DeleteEndpoint(id uint16) (SweepResult, error) {
	return m.DeleteExpired(0, func(ep uint16) bool { return ep != id })
}

// DeletePeerFlows deletes the entries whose side that names no local
// endpoint has one of the addresses in gone: flows of other nodes' pods
// that left (their addresses withdrawn from the ipcache). Until they
// expire, such entries would admit a later pod given the same address on
// the same ports as an established flow. Entries whose side with the
// address is a local endpoint are not touched.
func (m CTMap) DeletePeerFlows(gone map[netip.Addr]bool) (SweepResult, error) {
	var res SweepResult
	if len(gone) == 0 {
		return res, nil
	}
	var victims []CTEntry
	err := m.Iterate(func(e CTEntry) bool {
		res.Seen++
		if (e.SrcEndpoint == 0 && gone[e.Src.Unmap()]) || (e.DstEndpoint == 0 && gone[e.Dst.Unmap()]) {
			victims = append(victims, e)
		}
		return true
	})
	if err != nil && !errors.Is(err, ebpf.ErrIterationAborted) {
		return res, err
	}
	var errs []error
	for _, e := range victims {
		if err := m.Delete(e); err != nil {
			errs = append(errs, err)
			continue
		}
		res.Deleted++
	}
	return res, errors.Join(errs...)
}
