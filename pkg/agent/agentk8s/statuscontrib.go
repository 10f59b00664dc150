package agentk8s

import (
	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/status"
)

// statusContribution is the Kubernetes section of `tendril status` and its
// line of the v1 status; none in standalone mode.
func statusContribution(m *Module) status.Out {
	if m == nil {
		return status.Out{}
	}
	return status.Provide(status.Contribution{Order: status.OrderKubernetes, Section: status.Always(m.StatusSection),
		Model: func(r *ext.StatusResponse) { r.Kubernetes = m.Model() }})
}
