package hostdev

import (
	"github.com/tendril-net/tendril/pkg/status"
)

// statusOrder places this section in `tendril status` (pkg/status):
// after the datapath (30), before services (50).
const statusOrder = 40

// statusContribution is the masquerade's section of `tendril status`;
// none without the datapath.
func statusContribution(m *Masquerade) status.Out {
	if m == nil {
		return status.Out{}
	}
	return status.Provide(status.Contribution{Order: statusOrder, Section: status.Always(m.StatusSection)})
}
