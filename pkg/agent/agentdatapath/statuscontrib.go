package agentdatapath

import (
	"github.com/tendril-net/tendril/pkg/status"
)

// statusOrder places this section in `tendril status` (pkg/status):
// after Kubernetes (20), before masquerade (40).
const statusOrder = 30

// statusContribution is the datapath's section of `tendril status`;
// none without the datapath.
func statusContribution(m *Module) status.Out {
	if m == nil {
		return status.Out{}
	}
	return status.Provide(status.Contribution{Order: statusOrder, Section: status.Always(m.StatusSection)})
}
