package maps

import (
	"errors"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
)

// CTEntry is one conntrack entry, decoded.
type CTEntry struct {
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
	Proto            uint8
	Direction        uint8
	EndpointID       uint16
	// Expires is a bpf_ktime_get_ns() (CLOCK_MONOTONIC) deadline.
	Expires   uint64
	Packets   uint64
	Bytes     uint64
	SeenReply bool
	Closing   bool
	// IsReply marks the entry made for a flow's reply direction.
	IsReply bool
}

// DumpCT lists the conntrack table.
func (m *Maps) DumpCT() ([]CTEntry, error) {
	var out []CTEntry
	var k bpf.LxcCtKey
	var v bpf.LxcCtEntry
	it := m.CT.Iterate()
	for it.Next(&k, &v) {
		out = append(out, decodeCT(k, v))
	}
	return out, it.Err()
}

func decodeCT(k bpf.LxcCtKey, v bpf.LxcCtEntry) CTEntry {
	return CTEntry{
		Src: bytesAddr(k.Family, k.Saddr), Dst: bytesAddr(k.Family, k.Daddr),
		SrcPort: Ntohs(k.Sport), DstPort: Ntohs(k.Dport), Proto: k.Proto, Direction: k.Dir, EndpointID: k.EpId,
		Expires: v.Expires, Packets: v.Packets, Bytes: v.Bytes, SeenReply: v.SeenReply != 0, Closing: v.Closing != 0, IsReply: v.IsReply != 0,
	}
}

// CTKey builds the raw key of an entry (for tests and the GC).
func CTKey(e CTEntry) bpf.LxcCtKey {
	fam, s := addrBytes(e.Src)
	_, d := addrBytes(e.Dst)
	return bpf.LxcCtKey{Saddr: s, Daddr: d, Sport: Htons(e.SrcPort), Dport: Htons(e.DstPort), Proto: e.Proto, Family: fam, Dir: e.Direction, EpId: e.EndpointID}
}

// UpsertCT writes an entry (tests and benchmarks pre-load the table).
func (m *Maps) UpsertCT(e CTEntry) error {
	k := CTKey(e)
	v := bpf.LxcCtEntry{Expires: e.Expires, Packets: e.Packets, Bytes: e.Bytes}
	if e.SeenReply {
		v.SeenReply = 1
	}
	return m.CT.Put(&k, &v)
}

// DeleteExpiredCT deletes every entry whose deadline is before now (a
// CLOCK_MONOTONIC time in ns) or whose endpoint is gone (keep says whether
// an endpoint ID still exists; nil keeps all). It returns how many entries
// it saw and deleted.
func (m *Maps) DeleteExpiredCT(now uint64, keep func(epID uint16) bool) (seen, deleted int, err error) {
	var k bpf.LxcCtKey
	var v bpf.LxcCtEntry
	var stale []bpf.LxcCtKey
	it := m.CT.Iterate()
	for it.Next(&k, &v) {
		seen++
		if v.Expires < now || (keep != nil && !keep(k.EpId)) {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil && !errors.Is(err, ebpf.ErrIterationAborted) {
		return seen, 0, err
	}
	for i := range stale {
		if err := m.CT.Delete(&stale[i]); err == nil {
			deleted++
		}
	}
	return seen, deleted, nil
}
