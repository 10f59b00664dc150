package l2announcer

import (
	"github.com/tendril-net/tendril/pkg/status"
)

// statusOrder places this section in `tendril status` (pkg/status):
// after services (50), before Hubble (70).
const statusOrder = 60

// statusContribution is the announcer's section of `tendril status`;
// none with L2 announcements off.
func statusContribution(m *Announcer) status.Out {
	if m == nil {
		return status.Out{}
	}
	return status.Provide(status.Contribution{Order: statusOrder, Section: status.Always(m.StatusSection)})
}
