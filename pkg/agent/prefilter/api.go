package prefilter

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/cilium/cilium/api/v1/models"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/prefilter"
)

// statusInvalidCIDR is the spec's code for a deny list naming a bad CIDR
// (PatchPrefilterInvalidCIDR, DeletePrefilterInvalidCIDR).
const statusInvalidCIDR = 461

// syncWait bounds how long a change waits for the maps before it is
// answered (it stands either way; the reconciler retries).
const syncWait = 10 * time.Second

// apiHandlers serves /v1/prefilter. Off, each method answers the spec's
// failure code saying so.
func apiHandlers(pf *Prefilter) server.HandlersOut {
	return server.Handlers(func(api *server.Server) {
		api.Handle(http.MethodGet, "/v1/prefilter", func(w http.ResponseWriter, r *http.Request) error {
			if pf == nil {
				return errOff()
			}
			server.WriteJSON(w, http.StatusOK, pf.model())
			return nil
		})
		change := func(do func(context.Context, int64, []string) (prefilter.Spec, error)) server.HandlerFunc {
			return func(w http.ResponseWriter, r *http.Request) error {
				if pf == nil {
					return errOff()
				}
				var spec models.PrefilterSpec
				if err := server.DecodeJSON(r, &spec); err != nil {
					return err
				}
				ctx, cancel := context.WithTimeout(r.Context(), syncWait)
				defer cancel()
				if _, err := do(ctx, spec.Revision, spec.Deny); err != nil {
					switch {
					case errors.Is(err, prefilter.ErrInvalidCIDR):
						return server.Errorf(statusInvalidCIDR, "%v", err)
					default:
						// A stale revision and a full list are the spec's
						// failure (500, as Cilium answers them), with
						// the reason.
						return server.Errorf(http.StatusInternalServerError, "%v", err)
					}
				}
				server.WriteJSON(w, http.StatusOK, pf.model())
				return nil
			}
		}
		api.Handle(http.MethodPatch, "/v1/prefilter", change(func(ctx context.Context, rev int64, c []string) (prefilter.Spec, error) {
			return pf.list.Patch(ctx, rev, c)
		}))
		api.Handle(http.MethodDelete, "/v1/prefilter", change(func(ctx context.Context, rev int64, c []string) (prefilter.Spec, error) {
			return pf.list.Delete(ctx, rev, c)
		}))
	})
}

func errOff() error {
	return server.Errorf(http.StatusInternalServerError, "the XDP prefilter is off (--enable-xdp-prefilter)")
}

func (pf *Prefilter) model() prefilter.Model {
	desired, realized := pf.list.Get()
	m := prefilter.Model{Prefilter: models.Prefilter{
		Spec:   &models.PrefilterSpec{Revision: desired.Revision, Deny: desired.Deny},
		Status: &models.PrefilterStatus{Realized: &models.PrefilterSpec{Revision: realized.Revision, Deny: realized.Deny}},
	}, Devices: pf.devices}
	if c, err := pf.dp.Counters(); err == nil {
		m.Dropped = &prefilter.Dropped{IPv4Packets: c.IPv4Packets, IPv4Bytes: c.IPv4Bytes, IPv6Packets: c.IPv6Packets, IPv6Bytes: c.IPv6Bytes}
	} else {
		pf.log.Warn("Cannot read the prefilter's counters", "error", err)
	}
	return m
}
