package maps

import (
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
)

// DSR4MapName and DSR6MapName are the backend node's records of
// direct-server-return flows (bpf/lib/natmaps.h, written by
// bpf/lib/nodeport_dsr.h): IPv4 flows (from the IPv4 option or the
// Geneve DSR option) and IPv6 flows (from the IPv6 DSR extension header or
// the Geneve DSR option).
const (
	DSR4MapName = bpf.LxcMapTdrDsr4V1
	DSR6MapName = bpf.LxcMapTdrDsr6V1
)

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

// DSRMap is the record of DSR flows, both families (m6 may be nil: a
// map of IPv4 flows only).
type DSRMap struct{ m4, m6 *ebpf.Map }

// NewDSRMap wraps the loaded maps.
func NewDSRMap(m4, m6 *ebpf.Map) DSRMap { return DSRMap{m4: m4, m6: m6} }

// key is the flow's key in its family's map.
func (f DSRFlow) key() any {
	if f.Client.Is4() {
		return &bpf.LxcDsr4Key{Client: f.Client.As4(), Backend: f.Backend.As4(), ClientPort: Htons(f.ClientPort), BackendPort: Htons(f.BackendPort), Proto: f.Proto}
	}
	return &bpf.LxcDsr6Key{Client: f.Client.As16(), Backend: f.Backend.As16(), ClientPort: Htons(f.ClientPort), BackendPort: Htons(f.BackendPort), Proto: f.Proto}
}

// mapOf is the map of the flow's family.
func (t DSRMap) mapOf(f DSRFlow) (*ebpf.Map, error) {
	if f.Client.Is4() {
		return t.m4, nil
	}
	if t.m6 == nil {
		return nil, fmt.Errorf("DSR flow %+v: no IPv6 record", f)
	}
	return t.m6, nil
}

// Upsert writes a flow's record (tests; the datapath writes them).
func (t DSRMap) Upsert(f DSRFlow) error {
	v4 := f.Client.Is4()
	if !f.Client.IsValid() || !f.Backend.IsValid() || !f.Frontend.IsValid() || f.Backend.Is4() != v4 || f.Frontend.Is4() != v4 {
		return fmt.Errorf("DSR flow %+v: addresses of one family", f)
	}
	m, err := t.mapOf(f)
	if err != nil {
		return err
	}
	var v any
	if v4 {
		v = &bpf.LxcDsr4Entry{Addr: f.Frontend.As4(), Port: Htons(f.FrontendPort), Created: f.Created}
	} else {
		v = &bpf.LxcDsr6Entry{Addr: f.Frontend.As16(), Port: Htons(f.FrontendPort), Created: f.Created}
	}
	if err := m.Put(f.key(), v); err != nil {
		return fmt.Errorf("write DSR flow %s -> %s: %w", netip.AddrPortFrom(f.Client, f.ClientPort), netip.AddrPortFrom(f.Backend, f.BackendPort), err)
	}
	return nil
}

// List reads every record, IPv4 then IPv6.
func (t DSRMap) List() ([]DSRFlow, error) {
	var out []DSRFlow
	var k bpf.LxcDsr4Key
	var v bpf.LxcDsr4Entry
	it := t.m4.Iterate()
	for it.Next(&k, &v) {
		out = append(out, DSRFlow{Proto: k.Proto, Client: netip.AddrFrom4(k.Client), ClientPort: Ntohs(k.ClientPort),
			Backend: netip.AddrFrom4(k.Backend), BackendPort: Ntohs(k.BackendPort),
			Frontend: netip.AddrFrom4(v.Addr), FrontendPort: Ntohs(v.Port), Created: v.Created})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate IPv4 DSR flows: %w", err)
	}
	if t.m6 == nil {
		return out, nil
	}
	var k6 bpf.LxcDsr6Key
	var v6 bpf.LxcDsr6Entry
	it = t.m6.Iterate()
	for it.Next(&k6, &v6) {
		out = append(out, DSRFlow{Proto: k6.Proto, Client: netip.AddrFrom16(k6.Client), ClientPort: Ntohs(k6.ClientPort),
			Backend: netip.AddrFrom16(k6.Backend), BackendPort: Ntohs(k6.BackendPort),
			Frontend: netip.AddrFrom16(v6.Addr), FrontendPort: Ntohs(v6.Port), Created: v6.Created})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate IPv6 DSR flows: %w", err)
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
		m, err := t.mapOf(f)
		if err != nil {
			return res, err
		}
		if err := ignoreMissing(m.Delete(f.key())); err != nil {
			return res, fmt.Errorf("delete DSR flow %s: %w", netip.AddrPortFrom(f.Client, f.ClientPort), err)
		}
		res.Deleted++
	}
	return res, nil
}
