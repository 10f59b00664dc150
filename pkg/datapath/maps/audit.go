package maps

import (
	"fmt"

	"github.com/cilium/ebpf"
)

// AuditMap counts, per rule cookie, the connections audited policies
// would have denied (tdr_audit_v1, one counter per CPU).
type AuditMap struct{ m *ebpf.Map }

// Dump returns every rule's count, summed over CPUs.
func (m AuditMap) Dump() (map[uint32]uint64, error) {
	out := map[uint32]uint64{}
	var k uint32
	var per []uint64
	it := m.m.Iterate()
	for it.Next(&k, &per) {
		var n uint64
		for _, v := range per {
			n += v
		}
		out[k] = n
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate the audit counters: %w", err)
	}
	return out, nil
}

// Clear deletes every counter.
func (m AuditMap) Clear() error {
	var k uint32
	var keys []uint32
	it := m.m.Iterate()
	var per []uint64
	for it.Next(&k, &per) {
		keys = append(keys, k)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("iterate the audit counters: %w", err)
	}
	for _, k := range keys {
		if err := ignoreMissing(m.m.Delete(&k)); err != nil {
			return fmt.Errorf("clear audit counter %d: %w", k, err)
		}
	}
	return nil
}
