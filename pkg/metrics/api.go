package metrics

import (
	"net/http"
	"sort"

	"github.com/cilium/cilium/api/v1/models"
	dto "github.com/prometheus/client_model/go"

	"github.com/tendril-net/tendril/api/v1/server"
)

// API serves GET /v1/metrics/: the agent's metrics as Cilium's
// models.Metric list (`tendril metrics list`, `cilium-dbg metrics list`),
// so they can be read over the API socket where no Prometheus listener is
// configured (the lab's agents have none).
type API struct{ Metrics *Server }

// Register adds the metrics API's handler to the API server.
func (h *API) Register(api *server.Server) {
	api.Handle(http.MethodGet, "/v1/metrics/", h.handleList)
}

func (h *API) handleList(w http.ResponseWriter, _ *http.Request) error {
	families, err := h.Metrics.Registry.Gather()
	if err != nil {
		return server.Errorf(http.StatusInternalServerError, "gather metrics: %v", err)
	}
	out := []*models.Metric{}
	for _, fam := range families {
		for _, m := range fam.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			out = append(out, &models.Metric{Name: fam.GetName(), Labels: labels, Value: metricValue(fam.GetType(), m)})
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	server.WriteJSON(w, http.StatusOK, out)
	return nil
}

// metricValue is a sample's value: a histogram's or summary's count.
func metricValue(t dto.MetricType, m *dto.Metric) float64 {
	switch t {
	case dto.MetricType_COUNTER:
		return m.GetCounter().GetValue()
	case dto.MetricType_GAUGE:
		return m.GetGauge().GetValue()
	case dto.MetricType_UNTYPED:
		return m.GetUntyped().GetValue()
	case dto.MetricType_HISTOGRAM:
		return float64(m.GetHistogram().GetSampleCount())
	case dto.MetricType_SUMMARY:
		return float64(m.GetSummary().GetSampleCount())
	}
	return 0
}
