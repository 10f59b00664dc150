package agentservices

import (
	"github.com/tendril-net/tendril/pkg/status"
)

// statusContribution is the services' section of `tendril status`.
func statusContribution(m *Module) status.Out {
	if m == nil {
		return status.Out{}
	}
	return status.Provide(status.Contribution{Order: status.OrderServices, Section: status.Always(m.StatusSection)})
}
