package agentidentity

import (
	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/identity/identityapi"
	"github.com/tendril-net/tendril/pkg/identity/identitytable"
	"github.com/tendril-net/tendril/pkg/status"
)

// statusOrder places this section in `tendril status` (pkg/status):
// last: after endpoints (90).
const statusOrder = 100

// statusContribution is the identities' section of `tendril status`.
func statusContribution(ids identity.Allocator, table *identitytable.Table) status.Out {
	return status.Provide(status.Contribution{Order: statusOrder, Section: status.Always(func() ext.Section {
		return identityapi.StatusSection(ids, table)
	})})
}
