package agentendpoints

import (
	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/status"
)

// statusContribution is the IPAM and endpoints section of `tendril
// status` and the v1 IPAM model.
func statusContribution(m *Module) status.Out {
	if m == nil {
		return status.Out{}
	}
	return status.Provide(status.Contribution{Order: status.OrderEndpoints, Section: status.Always(m.StatusSection),
		Model: func(r *ext.StatusResponse) { r.Ipam = m.IPAMStatus() }})
}
