package agentservices

import (
	"github.com/tendril-net/tendril/pkg/status"
)

// statusOrder places this section in `tendril status` (pkg/status):
// after masquerade (40), before L2 announcements (60).
const statusOrder = 50

// statusContribution is the services' section of `tendril status`.
func statusContribution(m *Module) status.Out {
	if m == nil {
		return status.Out{}
	}
	return status.Provide(status.Contribution{Order: statusOrder, Section: status.Always(m.StatusSection)})
}
