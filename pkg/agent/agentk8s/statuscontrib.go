package agentk8s

import (
	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/status"
)

// statusOrder places this section in `tendril status` (pkg/status):
// after the kvstore (10), before the datapath (30).
const statusOrder = 20

// statusContribution is the Kubernetes section of `tendril status` and its
// line of the v1 status; none in standalone mode.
func statusContribution(m *Module) status.Out {
	if m == nil {
		return status.Out{}
	}
	return status.Provide(status.Contribution{Order: statusOrder, Section: status.Always(m.StatusSection),
		Model: func(r *ext.StatusResponse) { r.Kubernetes = m.Model() }})
}
