package dbinspect

import (
	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/status"
)

// statusOrder places this section in `tendril status` (pkg/status):
// after node health (75), before endpoints (90).
const statusOrder = 80

// StatusContribution is the tables' section of `tendril status`, shown
// only once a table is reconciled.
func StatusContribution(in *Inspector) status.Out {
	return status.Provide(status.Contribution{Order: statusOrder, Section: func() (ext.Section, bool) {
		sec := in.StatusSection()
		return sec, len(sec.Lines) > 0
	}})
}
