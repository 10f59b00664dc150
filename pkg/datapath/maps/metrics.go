package maps

import (
	"fmt"
	"sort"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
)

// Reasons of bpf/lib/common.h.
const (
	ReasonForwarded      uint8 = 0
	ReasonCTEstablished  uint8 = 1
	ReasonCTReply        uint8 = 2
	ReasonCTRelated      uint8 = 3
	ReasonPolicyDenied   uint8 = 10
	ReasonPolicyDenyRule uint8 = 11
	ReasonTruncated      uint8 = 12
	ReasonMalformed      uint8 = 13
	ReasonInvalidSource  uint8 = 14
	ReasonUnknownL3      uint8 = 15
	ReasonNoEndpoint     uint8 = 16
	ReasonFragment       uint8 = 17
)

// ReasonName names a reason for the CLI and metrics.
func ReasonName(r uint8) string {
	switch r {
	case ReasonForwarded:
		return "Forwarded"
	case ReasonCTEstablished:
		return "Forwarded (established connection)"
	case ReasonCTReply:
		return "Forwarded (reply)"
	case ReasonCTRelated:
		return "Forwarded (related ICMP error)"
	case ReasonPolicyDenied:
		return "Policy denied"
	case ReasonPolicyDenyRule:
		return "Policy denied by deny rule"
	case ReasonTruncated:
		return "Truncated packet"
	case ReasonMalformed:
		return "Malformed packet"
	case ReasonInvalidSource:
		return "Invalid source address"
	case ReasonUnknownL3:
		return "Unsupported L3 protocol"
	case ReasonNoEndpoint:
		return "No local endpoint for destination"
	case ReasonFragment:
		return "Fragment without reassembly state under policy"
	}
	return fmt.Sprintf("Reason %d", r)
}

// IsDrop reports whether a reason is a drop.
func IsDrop(r uint8) bool { return r >= ReasonPolicyDenied }

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

// DumpMetrics sums the per-CPU counters.
func (m *Maps) DumpMetrics() ([]MetricRow, error) {
	var out []MetricRow
	var k uint32
	var vs []bpf.LxcMetricValue
	it := m.Metrics.Iterate()
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
	sort.Slice(out, func(i, j int) bool {
		if out[i].Reason != out[j].Reason {
			return out[i].Reason < out[j].Reason
		}
		return out[i].Direction < out[j].Direction
	})
	return out, it.Err()
}
