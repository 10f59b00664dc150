// Package mapeventlog is the agent's cell for the BPF maps' recent
// changes: it provides the *mapevents.Registry the reconcilers of the
// ipcache, the LB maps and the policy map record their writes in, and
// serves them as GET /v1/map/{name}/events (the Cilium v1 API: a stream
// of MapEvent objects; with follow=true, the events as they come until
// the client goes).
package mapeventlog

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/hive/cell"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/mapevents"
)

// Cell provides the registry and serves its rings.
var Cell = cell.Module("map-events", "Recent changes of the BPF maps the reconcilers write",
	cell.Provide(func() *mapevents.Registry { return mapevents.NewRegistry(mapevents.DefaultSize) }, apiHandlers),
)

// resolve finds the ring of name: a ring's own name, or a short map name
// of GET /v1/map (ipcache, policy) for its pinned one.
func resolve(reg *mapevents.Registry, name string) (*mapevents.Ring, bool) {
	if r, ok := reg.Lookup(name); ok {
		return r, true
	}
	if full, ok := maps.PinnedNames()[name]; ok {
		return reg.Lookup(full)
	}
	return nil, false
}

func apiHandlers(reg *mapevents.Registry) server.HandlersOut {
	return server.Handlers(func(api *server.Server) {
		api.Handle(http.MethodGet, "/v1/map/{name}/events", func(w http.ResponseWriter, r *http.Request) error {
			name := r.PathValue("name")
			ring, ok := resolve(reg, name)
			if !ok {
				names := slices.Sorted(reg.Names())
				return server.Errorf(http.StatusNotFound, "map %q records no events (maps that do: %s)", name, strings.Join(names, ", "))
			}
			follow := false
			if v := r.URL.Query().Get("follow"); v != "" {
				var err error
				if follow, err = strconv.ParseBool(v); err != nil {
					return server.Errorf(http.StatusBadRequest, "follow=%q: not a boolean", v)
				}
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusOK)
			enc := json.NewEncoder(w)
			if !follow {
				for _, ev := range ring.Events() {
					if err := enc.Encode(ev); err != nil {
						return nil
					}
				}
				return nil
			}
			rc := http.NewResponseController(w)
			past, next := ring.Follow(r.Context())
			for _, ev := range past {
				if err := enc.Encode(ev); err != nil {
					return nil
				}
			}
			if err := rc.Flush(); err != nil {
				return fmt.Errorf("stream map events: %w", err)
			}
			for ev := range next {
				if err := enc.Encode(ev); err != nil {
					return nil
				}
				_ = rc.Flush()
			}
			return nil
		})
	})
}
