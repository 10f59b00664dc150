package maps

import (
	"fmt"
	"sort"

	"github.com/cilium/ebpf"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
)

// The reasons (Reason*, ReasonNames) are generated from bpf/lib/enums.h
// into enums_gen.go; the metrics map holds reasonMax × 2 counters.

// ReasonName names a reason for the CLI, events and metrics.
func ReasonName(r uint8) string {
	if n, ok := ReasonNames()[r]; ok {
		return n
	}
	return fmt.Sprintf("Reason %d", r)
}

// IsDrop reports whether a reason is a drop: those from
// ReasonPolicyDenied on, but ReasonToOverlay (a packet sent to another
// node through the tunnel, numbered after the drops that came first).
func IsDrop(r uint8) bool { return r >= ReasonPolicyDenied && r != ReasonToOverlay }

// DirectionName names a direction.
func DirectionName(d uint8) string {
	if d == DirIngress {
		return "ingress"
	}
	return "egress"
}

// MetricRow is one (reason, direction) counter summed over CPUs.
type MetricRow struct {
	Reason    uint8
	Direction uint8
	Packets   uint64
	Bytes     uint64
}

// MetricsMap holds per-CPU packet and byte counters by reason and
// direction.
type MetricsMap struct{ m *ebpf.Map }

// Lookup sums one counter over CPUs.
func (m MetricsMap) Lookup(reason, dir uint8) (MetricRow, error) {
	row := MetricRow{Reason: reason, Direction: dir}
	if reason >= reasonMax || dir > 1 {
		return row, fmt.Errorf("no counter for reason %d direction %d", reason, dir)
	}
	k := uint32(reason)<<1 | uint32(dir)
	var vs []bpf.LxcMetricValue
	if err := m.m.Lookup(&k, &vs); err != nil {
		return row, fmt.Errorf("read counter %s %s: %w", ReasonName(reason), DirectionName(dir), err)
	}
	for _, v := range vs {
		row.Packets += v.Packets
		row.Bytes += v.Bytes
	}
	return row, nil
}

// Iterate calls fn for each non-zero counter in (reason, direction)
// order until fn returns false.
func (m MetricsMap) Iterate(fn func(MetricRow) bool) error {
	rows, err := m.Dump()
	if err != nil {
		return err
	}
	for _, r := range rows {
		if !fn(r) {
			return nil
		}
	}
	return nil
}

// Dump returns the non-zero counters, summed over CPUs.
func (m MetricsMap) Dump() ([]MetricRow, error) {
	var out []MetricRow
	var k uint32
	var vs []bpf.LxcMetricValue
	it := m.m.Iterate()
	for it.Next(&k, &vs) {
		row := MetricRow{Reason: uint8(k >> 1), Direction: uint8(k & 1)}
		for _, v := range vs {
			row.Packets += v.Packets
			row.Bytes += v.Bytes
		}
		if row.Packets == 0 {
			continue
		}
		out = append(out, row)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read counters: %w", err)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Reason != out[j].Reason {
			return out[i].Reason < out[j].Reason
		}
		return out[i].Direction < out[j].Direction
	})
	return out, nil
}

// Count is the number of non-zero counters.
func (m MetricsMap) Count() (int, error) {
	rows, err := m.Dump()
	return len(rows), err
}
