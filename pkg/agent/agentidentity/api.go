package agentidentity

import (
	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/identity/identityapi"
	"github.com/tendril-net/tendril/pkg/identity/identitytable"
	"github.com/tendril-net/tendril/pkg/ipcache"
)

// Endpoints are the endpoints as the identities API lists them; an error
// before the endpoints' start step built their manager.
type Endpoints interface {
	ListForAPI() ([]*endpoint.Endpoint, error)
}

// apiHandlers serves the identities API; ipc is nil without the datapath.
func apiHandlers(table *identitytable.Table, eps Endpoints, ipc *ipcache.IPCache) server.HandlersOut {
	return server.Handlers((&identityapi.Handlers{Identities: table, Endpoints: eps.ListForAPI, IPCache: ipc}).Register)
}
