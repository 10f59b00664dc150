package l2announcer

import (
	"github.com/tendril-net/tendril/pkg/status"
)

// statusContribution is the announcer's section of `tendril status`;
// none with L2 announcements off.
func statusContribution(m *Announcer) status.Out {
	if m == nil {
		return status.Out{}
	}
	return status.Provide(status.Contribution{Order: status.OrderL2, Section: status.Always(m.StatusSection)})
}
