package prefilter

import "github.com/cilium/cilium/api/v1/models"

// Model is GET /v1/prefilter: the Cilium v1 Prefilter with Tendril's drop
// counters and devices beside it (a client reading the spec's fields
// ignores them). The agent writes it and `tendril prefilter` reads it.
type Model struct {
	models.Prefilter
	// Dropped are the packets dropped since the maps were created.
	Dropped *Dropped `json:"dropped,omitempty"`
	// Devices are the devices the program is attached to.
	Devices []string `json:"devices,omitempty"`
}

// Dropped are the prefilter's drop counters.
type Dropped struct {
	IPv4Packets uint64 `json:"ipv4-packets"`
	IPv4Bytes   uint64 `json:"ipv4-bytes"`
	IPv6Packets uint64 `json:"ipv6-packets"`
	IPv6Bytes   uint64 `json:"ipv6-bytes"`
}
