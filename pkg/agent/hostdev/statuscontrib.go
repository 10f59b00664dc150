package hostdev

import (
	"github.com/tendril-net/tendril/pkg/status"
)

// statusContribution is the masquerade's section of `tendril status`;
// none without the datapath.
func statusContribution(m *Masquerade) status.Out {
	if m == nil {
		return status.Out{}
	}
	return status.Provide(status.Contribution{Order: status.OrderMasquerade, Section: status.Always(m.StatusSection)})
}
