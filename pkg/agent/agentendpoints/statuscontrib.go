package agentendpoints

import (
	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/status"
)

// statusOrder places this section in `tendril status` (pkg/status):
// after the tables (80), before identities (100).
const statusOrder = 90

// statusContribution is the IPAM and endpoints section of `tendril
// status` and the v1 IPAM model.
func statusContribution(m *Module) status.Out {
	if m == nil {
		return status.Out{}
	}
	return status.Provide(status.Contribution{Order: statusOrder, Section: status.Always(m.StatusSection),
		Model: func(r *ext.StatusResponse) { r.Ipam = m.IPAMStatus() }})
}
