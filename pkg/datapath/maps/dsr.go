package maps

import (
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
)

// DSR4MapName is the backend node's record of direct-server-return flows
// (bpf/lib/natmaps.h, written by bpf/lib/nodeport_dsr.h).
const DSR4MapName = bpf.LxcMapTdrDsr4V1

// DSRFlow is one flow another node sent here by direct server return:
// the client's tuple to the local backend, and the service frontend the
// backend's replies leave with.
type DSRFlow struct {
	Proto      uint8
	Client     netip.Addr
	ClientPort uint16
	// Backend and BackendPort are the local pod's.
	Backend     netip.Addr
	BackendPort uint16
	// Frontend and FrontendPort are the service address the client used
	// (another node's node port, say).
	Frontend     netip.Addr
	FrontendPort uint16
	// Created is when the flow was recorded (CLOCK_MONOTONIC_COARSE ns).
	Created uint64
}

// DSRMap is the IPv4 record of DSR flows.
type DSRMap struct{ m *ebpf.Map }

// NewDSRMap wraps the loaded map.
func NewDSRMap(m *ebpf.Map) DSRMap { return DSRMap{m: m} }

func (f DSRFlow) key() bpf.LxcDsr4Key {
	return bpf.LxcDsr4Key{Client: f.Client.As4(), Backend: f.Backend.As4(), ClientPort: Htons(f.ClientPort), BackendPort: Htons(f.BackendPort), Proto: f.Proto}
}

// Upsert writes a flow's record (tests; the datapath writes them).
func (t DSRMap) Upsert(f DSRFlow) error {
	if !f.Client.Is4() || !f.Backend.Is4() || !f.Frontend.Is4() {
		return fmt.Errorf("DSR flow %+v: IPv4 addresses only", f)
	}
	k := f.key()
	v := bpf.LxcDsr4Entry{Addr: f.Frontend.As4(), Port: Htons(f.FrontendPort), Created: f.Created}
	if err := t.m.Put(&k, &v); err != nil {
		return fmt.Errorf("write DSR flow %s -> %s: %w", netip.AddrPortFrom(f.Client, f.ClientPort), netip.AddrPortFrom(f.Backend, f.BackendPort), err)
	}
	return nil
}

// List reads every record.
func (t DSRMap) List() ([]DSRFlow, error) {
	var k bpf.LxcDsr4Key
	var v bpf.LxcDsr4Entry
	var out []DSRFlow
	it := t.m.Iterate()
	for it.Next(&k, &v) {
		out = append(out, DSRFlow{Proto: k.Proto, Client: netip.AddrFrom4(k.Client), ClientPort: Ntohs(k.ClientPort),
			Backend: netip.AddrFrom4(k.Backend), BackendPort: Ntohs(k.BackendPort),
			Frontend: netip.AddrFrom4(v.Addr), FrontendPort: Ntohs(v.Port), Created: v.Created})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate DSR flows: %w", err)
	}
	return out, nil
}

// DSRSweep counts one collection of the DSR records.
type DSRSweep struct{ Seen, Deleted int }

// CollectDSR deletes the records whose flow has no live conntrack entry
// (ct, at monotonic time now) and that are older than NATMinAge: the
// datapath records the flow as it arrives, before the pod's to_pod makes
// its conntrack entry, so a GC walk must not take a fresh record.
func (t DSRMap) CollectDSR(ct CTMap, now uint64) (DSRSweep, error) {
	var res DSRSweep
	list, err := t.List()
	if err != nil {
		return res, err
	}
	minAge := uint64(NATMinAge.Nanoseconds())
	for _, f := range list {
		res.Seen++
		if f.Created+minAge > now {
			continue
		}
		e, found, err := ct.Lookup(CTEntry{Proto: f.Proto, Src: f.Client, SrcPort: f.ClientPort, Dst: f.Backend, DstPort: f.BackendPort})
		if err != nil {
			return res, err
		}
		if found && e.Expires > now {
			continue
		}
		k := f.key()
		if err := ignoreMissing(t.m.Delete(&k)); err != nil {
			return res, fmt.Errorf("delete DSR flow %s: %w", netip.AddrPortFrom(f.Client, f.ClientPort), err)
		}
		res.Deleted++
	}
	return res, nil
}
