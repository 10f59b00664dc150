package agentkv

import (
	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/status"
)

// statusContribution is the kvstore's section of `tendril status` and its
// line of the v1 status; none without a kvstore (the handler reports it
// disabled).
func statusContribution(m *Module) status.Out {
	if m == nil {
		return status.Out{}
	}
	return status.Provide(status.Contribution{Order: status.OrderKVStore, Section: status.Always(m.StatusSection),
		Model: func(r *ext.StatusResponse) { r.Kvstore = m.Model() }})
}
