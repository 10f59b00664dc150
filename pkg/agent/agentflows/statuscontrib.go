package agentflows

import (
	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/status"
)

// statusOrder places this section in `tendril status` (pkg/status):
// after L2 announcements (60), before node health (75).
const statusOrder = 70

// statusContribution is the flows' section of `tendril status` and the
// v1 Hubble model; none with flows off.
func statusContribution(m *Module) status.Out {
	if m == nil {
		return status.Out{}
	}
	return status.Provide(status.Contribution{Order: statusOrder, Section: status.Always(m.StatusSection),
		Model: func(r *ext.StatusResponse) { r.Hubble = m.HubbleModel() }})
}
