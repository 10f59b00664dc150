package dbinspect

import (
	"fmt"
	"net/http"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/api/v1/server"
)

// RegisterAPI serves the statedb tables under /v1/statedb/: the
// summaries (/tables), the objects as rows (/rows/{table}) and statedb's
// own dumps and queries (/dump, /dump/{table}, /query, /changes/{table}).
func (in *Inspector) RegisterAPI(api *server.Server) {
	h := http.StripPrefix("/v1/statedb", in.Handler())
	api.Handle(http.MethodGet, "/v1/statedb/", func(w http.ResponseWriter, r *http.Request) error {
		h.ServeHTTP(w, r)
		return nil
	})
}

// StatusSection is the `tendril status` line per reconciled table: how
// many of its objects are not realized yet.
func (in *Inspector) StatusSection() ext.Section {
	sec := ext.Section{Title: "Tables"}
	for _, t := range in.Tables() {
		if !t.Reconciled {
			continue
		}
		v := fmt.Sprintf("%d objects, %d pending, %d failing", t.Objects, t.Pending, t.Errors)
		if t.LastError != "" {
			v += " (" + t.LastError + ")"
		}
		if !t.Initialized {
			v += "; initializing, no prune yet"
		}
		sec.Lines = append(sec.Lines, ext.Line{Key: t.Name, Value: v})
	}
	return sec
}

// apiHandlers serves the tables' inspection API.
// APIHandlers registers the inspector's handlers on the agent's API.
func APIHandlers(in *Inspector) server.HandlersOut { return server.Handlers(in.RegisterAPI) }
