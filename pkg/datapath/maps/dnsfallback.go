package maps

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
)

// DNSFallbackMapName is the DNS fallback's pinned map (bpf/lib/dnsfb.h).
const DNSFallbackMapName = bpf.LxcMapTdrDnsFallbackV1

// DNSFallbackKey is one entry of tdr_dns_fallback_v1: an endpoint's
// allowed name (DNSFallbackName), *.rest suffix (DNSFallbackSuffix) or
// marker (DNSFallbackFilter, DNSFallbackAll, hash 0).
type DNSFallbackKey struct {
	EndpointID uint16
	Kind       uint8
	Hash       uint64
}

// DNSFallbackMap is the typed tdr_dns_fallback_v1.
type DNSFallbackMap struct{ m *ebpf.Map }

// DNSFallbackMap is the typed DNS fallback map.
func (m *Maps) DNSFallbackMap() DNSFallbackMap { return DNSFallbackMap{m: m.DNSFallback} }

// NewDNSFallbackMap wraps an open tdr_dns_fallback_v1.
func NewDNSFallbackMap(m *ebpf.Map) DNSFallbackMap { return DNSFallbackMap{m: m} }

func (k DNSFallbackKey) raw() bpf.LxcDnsfbKey {
	return bpf.LxcDnsfbKey{EpId: k.EndpointID, Kind: k.Kind, Hash: k.Hash}
}

// Put adds an entry.
func (d DNSFallbackMap) Put(k DNSFallbackKey) error {
	if d.m == nil {
		return errors.New("dns fallback map not open")
	}
	raw := k.raw()
	if err := d.m.Put(&raw, uint8(1)); err != nil {
		return fmt.Errorf("write %s entry %+v: %w", DNSFallbackMapName, k, err)
	}
	return nil
}

// Delete removes an entry (a missing one is no error).
func (d DNSFallbackMap) Delete(k DNSFallbackKey) error {
	if d.m == nil {
		return errors.New("dns fallback map not open")
	}
	raw := k.raw()
	if err := ignoreMissing(d.m.Delete(&raw)); err != nil {
		return fmt.Errorf("delete %s entry %+v: %w", DNSFallbackMapName, k, err)
	}
	return nil
}

// Has reports whether entry k is in the map.
func (d DNSFallbackMap) Has(k DNSFallbackKey) (bool, error) {
	if d.m == nil {
		return false, errors.New("dns fallback map not open")
	}
	raw := k.raw()
	var v uint8
	if err := d.m.Lookup(&raw, &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return false, nil
		}
		return false, fmt.Errorf("look up %s entry %+v: %w", DNSFallbackMapName, k, err)
	}
	return true, nil
}

// Dump reads every entry, by endpoint.
func (d DNSFallbackMap) Dump() (map[uint16][]DNSFallbackKey, error) {
	if d.m == nil {
		return nil, errors.New("dns fallback map not open")
	}
	out := map[uint16][]DNSFallbackKey{}
	var raw bpf.LxcDnsfbKey
	var v uint8
	it := d.m.Iterate()
	for it.Next(&raw, &v) {
		out[raw.EpId] = append(out[raw.EpId], DNSFallbackKey{EndpointID: raw.EpId, Kind: raw.Kind, Hash: raw.Hash})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", DNSFallbackMapName, err)
	}
	return out, nil
}

// DumpEndpoint reads endpoint id's entries (a walk over the whole map: it
// is keyed by hash, not by endpoint).
func (d DNSFallbackMap) DumpEndpoint(id uint16) ([]DNSFallbackKey, error) {
	all, err := d.Dump()
	if err != nil {
		return nil, err
	}
	return all[id], nil
}

// DeleteEndpoint removes endpoint id's entries, its filter marker first
// (so that no moment filters with part of its names).
func (d DNSFallbackMap) DeleteEndpoint(id uint16) error {
	keys, err := d.DumpEndpoint(id)
	if err != nil {
		return err
	}
	marker := DNSFallbackKey{EndpointID: id, Kind: DNSFallbackFilter}
	if err := d.Delete(marker); err != nil {
		return err
	}
	for _, k := range keys {
		if k == marker {
			continue
		}
		if err := d.Delete(k); err != nil {
			return err
		}
	}
	return nil
}
