package maps

import (
	"fmt"
	"net"
	"net/netip"
	"path/filepath"

	"github.com/cilium/ebpf"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
)

// L2ResponderMapName is the L2 announcements' ARP responder map
// (bpf/lib/l2maps.h).
const L2ResponderMapName = bpf.LxcMapTdrL2ResponderV4

// L2ResponderKey is an announced IPv4 address on one device.
type L2ResponderKey struct {
	Addr    netip.Addr
	IfIndex int
}

// L2ResponderEntry is what the responder answers with: the device's MAC,
// until Expires (CLOCK_MONOTONIC ns).
type L2ResponderEntry struct {
	MAC     net.HardwareAddr
	Expires uint64
}

// L2ResponderMap is tdr_l2_responder_v4.
type L2ResponderMap struct{ m *ebpf.Map }

// NewL2ResponderMap wraps the map.
func NewL2ResponderMap(m *ebpf.Map) *L2ResponderMap { return &L2ResponderMap{m: m} }

// L2Responder is the loaded datapath's responder map.
func (m *Maps) L2Responder() *L2ResponderMap { return &L2ResponderMap{m: m.L2Resp} }

// OpenPinnedL2Responder opens the map pinned under root (the CLI reads it
// while the agent is down).
func OpenPinnedL2Responder(root string, readOnly bool) (*L2ResponderMap, error) {
	mp, err := ebpf.LoadPinnedMap(filepath.Join(root, L2ResponderMapName), &ebpf.LoadPinOptions{ReadOnly: readOnly})
	if err != nil {
		return nil, fmt.Errorf("open pinned map %s under %s: %w", L2ResponderMapName, root, err)
	}
	return &L2ResponderMap{m: mp}, nil
}

func l2Key(k L2ResponderKey) (bpf.LxcL2ResponderV4Key, error) {
	if !k.Addr.Unmap().Is4() {
		return bpf.LxcL2ResponderV4Key{}, fmt.Errorf("l2 responder: %s is not an IPv4 address", k.Addr)
	}
	if k.IfIndex <= 0 {
		return bpf.LxcL2ResponderV4Key{}, fmt.Errorf("l2 responder: ifindex %d of %s", k.IfIndex, k.Addr)
	}
	return bpf.LxcL2ResponderV4Key{Addr: k.Addr.Unmap().As4(), Ifindex: uint32(k.IfIndex)}, nil
}

// Set writes an entry.
func (r *L2ResponderMap) Set(k L2ResponderKey, e L2ResponderEntry) error {
	key, err := l2Key(k)
	if err != nil {
		return err
	}
	if len(e.MAC) != 6 {
		return fmt.Errorf("l2 responder %s on %d: MAC %q is not 6 bytes", k.Addr, k.IfIndex, e.MAC)
	}
	v := bpf.LxcL2ResponderEntry{Expires: e.Expires}
	copy(v.Mac[:], e.MAC)
	if err := r.m.Put(&key, &v); err != nil {
		return fmt.Errorf("write l2 responder %s on %d: %w", k.Addr, k.IfIndex, err)
	}
	return nil
}

// Delete removes an entry; a missing one is fine.
func (r *L2ResponderMap) Delete(k L2ResponderKey) error {
	key, err := l2Key(k)
	if err != nil {
		return err
	}
	if err := ignoreMissing(r.m.Delete(&key)); err != nil {
		return fmt.Errorf("delete l2 responder %s on %d: %w", k.Addr, k.IfIndex, err)
	}
	return nil
}

// List returns every entry.
func (r *L2ResponderMap) List() (map[L2ResponderKey]L2ResponderEntry, error) {
	out := map[L2ResponderKey]L2ResponderEntry{}
	var k bpf.LxcL2ResponderV4Key
	var v bpf.LxcL2ResponderEntry
	it := r.m.Iterate()
	for it.Next(&k, &v) {
		out[L2ResponderKey{Addr: netip.AddrFrom4(k.Addr), IfIndex: int(k.Ifindex)}] =
			L2ResponderEntry{MAC: net.HardwareAddr(append([]byte(nil), v.Mac[:]...)), Expires: v.Expires}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("list l2 responder: %w", err)
	}
	return out, nil
}

// Close releases the handle (the pin stays).
func (r *L2ResponderMap) Close() error { return r.m.Close() }
