package dbinspect

import (
	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/status"
)

// statusContribution is the tables' section of `tendril status`, shown
// only once a table is reconciled.
// StatusContribution is the tables' section of `tendril status`.
func StatusContribution(in *Inspector) status.Out {
	return status.Provide(status.Contribution{Order: status.OrderTables, Section: func() (ext.Section, bool) {
		sec := in.StatusSection()
		return sec, len(sec.Lines) > 0
	}})
}
