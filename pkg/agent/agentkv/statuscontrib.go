package agentkv

import (
	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/status"
)

// statusOrder places this section in `tendril status` (pkg/status):
// first: the kvstore's state decides the rest.
const statusOrder = 10

// statusContribution is the kvstore's section of `tendril status` and its
// line of the v1 status; none without a kvstore (the handler reports it
// disabled).
func statusContribution(m *Module) status.Out {
	if m == nil {
		return status.Out{}
	}
	return status.Provide(status.Contribution{Order: statusOrder, Section: status.Always(m.StatusSection),
		Model: func(r *ext.StatusResponse) { r.Kvstore = m.Model() }})
}
