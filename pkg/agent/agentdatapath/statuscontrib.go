package agentdatapath

import (
	"github.com/tendril-net/tendril/pkg/status"
)

// statusContribution is the datapath's section of `tendril status`;
// none without the datapath.
func statusContribution(m *Module) status.Out {
	if m == nil {
		return status.Out{}
	}
	return status.Provide(status.Contribution{Order: status.OrderDatapath, Section: status.Always(m.StatusSection)})
}
