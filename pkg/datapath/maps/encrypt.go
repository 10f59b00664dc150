package maps

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
)

// EncryptMaps are WireGuard strict mode's maps (bpf/lib/encrypt.h): the
// one-entry tdr_encrypt_v1 (the device's ifindex and the strict flag)
// and the LPM trie tdr_encrypt_cidrs_v1 of the other nodes' pod CIDRs,
// each marked with whether its node is a peer with a key.
type EncryptMaps struct {
	Config *ebpf.Map
	CIDRs  *ebpf.Map
}

// NewEncryptMaps takes the two maps from the pod programs' maps by name
// (loader.MapReplacements).
func NewEncryptMaps(byName map[string]*ebpf.Map) (EncryptMaps, error) {
	m := EncryptMaps{Config: byName[bpf.LxcMapTdrEncryptV1], CIDRs: byName[bpf.LxcMapTdrEncryptCidrsV1]}
	if m.Config == nil || m.CIDRs == nil {
		return m, fmt.Errorf("encryption maps %s, %s not loaded", bpf.LxcMapTdrEncryptV1, bpf.LxcMapTdrEncryptCidrsV1)
	}
	return m, nil
}

// SetDevice writes the configuration entry: the WireGuard device (0:
// none), whether strict mode is on and, in the tunnel routing mode, the
// tunnel's UDP port (0 in native routing): strict mode then checks where
// the encapsulated datagram goes.
func (m EncryptMaps) SetDevice(ifindex int, strict bool, tunnelPort uint16) error {
	v := bpf.LxcEncryptInfo{Ifindex: uint32(ifindex), Flags: uint32(tunnelPort) << EncryptTunnelPortShift}
	if strict {
		v.Flags |= EncryptFlagStrict
	}
	if err := m.Config.Put(uint32(0), &v); err != nil {
		return fmt.Errorf("write %s: %w", bpf.LxcMapTdrEncryptV1, err)
	}
	return nil
}

// Device reads the configuration entry.
func (m EncryptMaps) Device() (ifindex int, strict bool, err error) {
	var v bpf.LxcEncryptInfo
	if err := m.Config.Lookup(uint32(0), &v); err != nil {
		return 0, false, fmt.Errorf("read %s: %w", bpf.LxcMapTdrEncryptV1, err)
	}
	return int(v.Ifindex), v.Flags&EncryptFlagStrict != 0, nil
}

// ReadCIDRs reads the pod CIDRs and whether each one's node is a peer.
func (m EncryptMaps) ReadCIDRs() (map[netip.Prefix]bool, error) {
	out := map[netip.Prefix]bool{}
	var k bpf.LxcIpcacheKey
	var v uint32
	it := m.CIDRs.Iterate()
	for it.Next(&k, &v) {
		out[netip.PrefixFrom(bytesAddr(k.Family, k.Addr), int(k.Prefixlen)-32)] = v != 0
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", bpf.LxcMapTdrEncryptCidrsV1, err)
	}
	return out, nil
}

// SyncCIDRs makes the trie hold exactly want (prune: also delete what want
// does not name; without it only add and update). An entry already right
// is not written.
func (m EncryptMaps) SyncCIDRs(want map[netip.Prefix]bool, prune bool) error {
	have, err := m.ReadCIDRs()
	if err != nil {
		return err
	}
	var errs []error
	for p, peer := range want {
		if cur, ok := have[p.Masked()]; ok && cur == peer {
			continue
		}
		k, err := ipcacheKey(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var v uint32
		if peer {
			v = 1
		}
		if err := m.CIDRs.Put(&k, &v); err != nil {
			errs = append(errs, fmt.Errorf("write %s %s: %w", bpf.LxcMapTdrEncryptCidrsV1, p, err))
		}
	}
	if prune {
		named := map[netip.Prefix]bool{}
		for p := range want {
			named[p.Masked()] = true
		}
		for p := range have {
			if named[p] {
				continue
			}
			k, err := ipcacheKey(p)
			if err == nil {
				err = m.CIDRs.Delete(&k)
			}
			if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, fmt.Errorf("delete %s %s: %w", bpf.LxcMapTdrEncryptCidrsV1, p, err))
			}
		}
	}
	return errors.Join(errs...)
}
