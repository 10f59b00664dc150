package agentpolicy

import (
	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/policy/policyapi"
)

// apiHandlers serves the policy API over the repository; rules imported
// through it are the SourceAPI rules the policy file keeps.
func apiHandlers(m *Module) server.HandlersOut {
	return server.Handlers((&policyapi.Handlers{Repo: m.Repository(), Universe: m.Universe, Source: SourceAPI}).Register)
}
