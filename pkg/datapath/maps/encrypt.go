package maps

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
)

// EncryptMaps are WireGuard strict mode's and node encryption's maps
// (bpf/lib/encrypt.h): the one-entry tdr_encrypt_v1 (the device's ifindex,
// the strict and node flags) and the LPM trie tdr_encrypt_cidrs_v1 of the
// other nodes' pod CIDRs and, with node encryption, their own addresses,
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
// none), whether strict mode and node encryption are on and, in the
// tunnel routing mode, the tunnel's UDP port (0 in native routing):
// strict mode then checks where the encapsulated datagram goes.
func (m EncryptMaps) SetDevice(ifindex int, strict, node bool, tunnelPort uint16) error {
	v := bpf.LxcEncryptInfo{Ifindex: uint32(ifindex), Flags: uint32(tunnelPort) << EncryptTunnelPortShift}
	if strict {
		v.Flags |= EncryptFlagStrict
	}
	if node {
		v.Flags |= EncryptFlagNode
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
	return m.read(0)
}

// ReadNodeAddrs reads the node addresses (node encryption) and whether
// each one's node is a peer.
func (m EncryptMaps) ReadNodeAddrs() (map[netip.Addr]bool, error) {
	have, err := m.read(EncryptDstNode)
	if err != nil {
		return nil, err
	}
	out := map[netip.Addr]bool{}
	for p, peer := range have {
		out[p.Addr()] = peer
	}
	return out, nil
}

// read reads the trie's entries of one kind (kind: 0 for pod CIDRs,
// EncryptDstNode for node addresses) and whether each one's node is a
// peer.
func (m EncryptMaps) read(kind uint32) (map[netip.Prefix]bool, error) {
	out := map[netip.Prefix]bool{}
	var k bpf.LxcIpcacheKey
	var v uint32
	it := m.CIDRs.Iterate()
	for it.Next(&k, &v) {
		if v&EncryptDstNode != kind {
			continue
		}
		out[netip.PrefixFrom(bytesAddr(k.Family, k.Addr), int(k.Prefixlen)-32)] = v&EncryptDstPeer != 0
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", bpf.LxcMapTdrEncryptCidrsV1, err)
	}
	return out, nil
}

// SyncCIDRs makes the trie's pod CIDRs exactly want (prune: also delete
// what want does not name; without it only add and update). An entry
// already right is not written. The node addresses are left alone.
func (m EncryptMaps) SyncCIDRs(want map[netip.Prefix]bool, prune bool) error {
	return m.sync(0, want, prune)
}

// SyncNodeAddrs makes the trie's node addresses exactly want (each
// marked with whether its node is a peer), as SyncCIDRs does for the pod
// CIDRs; the pod CIDRs are left alone.
func (m EncryptMaps) SyncNodeAddrs(want map[netip.Addr]bool, prune bool) error {
	prefixes := make(map[netip.Prefix]bool, len(want))
	for a, peer := range want {
		prefixes[netip.PrefixFrom(a, a.BitLen())] = peer
	}
	return m.sync(EncryptDstNode, prefixes, prune)
}

func (m EncryptMaps) sync(kind uint32, want map[netip.Prefix]bool, prune bool) error {
	have, err := m.read(kind)
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
		v := kind
		if peer {
			v |= EncryptDstPeer
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
