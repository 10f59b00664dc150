package agentflows

import (
	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/status"
)

// statusContribution is the flows' section of `tendril status` and the
// v1 Hubble model; none with flows off.
func statusContribution(m *Module) status.Out {
	if m == nil {
		return status.Out{}
	}
	return status.Provide(status.Contribution{Order: status.OrderHubble, Section: status.Always(m.StatusSection),
		Model: func(r *ext.StatusResponse) { r.Hubble = m.HubbleModel() }})
}
