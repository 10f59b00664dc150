package bgpcp

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/cilium/cilium/api/v1/models"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/bgp/speaker"
)

// apiHandlers serves GET /v1/bgp/peers, /v1/bgp/routes and
// /v1/bgp/route-policies as Cilium's v1 API defines them
// (models.BgpPeer, models.BgpRoute, models.BgpRoutePolicy); 501 with the
// control plane off, as Cilium answers.
func apiHandlers(cp *ControlPlane) server.HandlersOut {
	return server.Handlers(func(api *server.Server) {
		api.Handle(http.MethodGet, "/v1/bgp/peers", func(w http.ResponseWriter, r *http.Request) error {
			if cp == nil {
				return disabled()
			}
			peers, err := cp.speaker.Peers(r.Context())
			if err != nil {
				return server.Errorf(http.StatusInternalServerError, "%v", err)
			}
			server.WriteJSON(w, http.StatusOK, peers)
			return nil
		})
		api.Handle(http.MethodGet, "/v1/bgp/routes", func(w http.ResponseWriter, r *http.Request) error {
			if cp == nil {
				return disabled()
			}
			q := r.URL.Query()
			if asn := q.Get("router_asn"); asn != "" {
				n, err := strconv.ParseUint(asn, 10, 32)
				if err != nil {
					return server.Errorf(http.StatusBadRequest, "router_asn %q: not an ASN", asn)
				}
				// One instance per node: another ASN selects nothing.
				if last := cp.Last(); uint32(n) != last.Desired.LocalASN {
					server.WriteJSON(w, http.StatusOK, []any{})
					return nil
				}
			}
			routes, err := cp.speaker.Routes(r.Context(), speaker.RouteQuery{TableType: q.Get("table_type"),
				AFI: q.Get("afi"), SAFI: q.Get("safi"), Neighbor: q.Get("neighbor")})
			switch {
			case errors.Is(err, speaker.ErrBadQuery):
				return server.Errorf(http.StatusBadRequest, "%v", err)
			case err != nil:
				return server.Errorf(http.StatusInternalServerError, "%v", err)
			}
			server.WriteJSON(w, http.StatusOK, routes)
			return nil
		})
		// The speaker runs no route policies (every advert passes the
		// guard before it reaches gobgp instead): the list is empty.
		api.Handle(http.MethodGet, "/v1/bgp/route-policies", func(w http.ResponseWriter, r *http.Request) error {
			if cp == nil {
				return disabled()
			}
			if asn := r.URL.Query().Get("router_asn"); asn != "" {
				if _, err := strconv.ParseUint(asn, 10, 32); err != nil {
					return server.Errorf(http.StatusBadRequest, "router_asn %q: not an ASN", asn)
				}
			}
			server.WriteJSON(w, http.StatusOK, []*models.BgpRoutePolicy{})
			return nil
		})
	})
}

func disabled() error {
	return server.Errorf(http.StatusNotImplemented, "BGP Control Plane disabled (--enable-bgp-control-plane=false)")
}
