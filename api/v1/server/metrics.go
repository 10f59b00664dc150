package server

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// requestMetrics counts API requests by route pattern, method and code.
type requestMetrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newRequestMetrics(reg prometheus.Registerer) (*requestMetrics, error) {
	m := &requestMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "tendril", Subsystem: "api", Name: "requests_total",
			Help: "API requests served, by path pattern, method and status code.",
		}, []string{"path", "method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "tendril", Subsystem: "api", Name: "request_duration_seconds",
			Help:    "API request latency, by path pattern and method.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 9),
		}, []string{"path", "method"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.requests, m.duration} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer (a
// streamed answer flushes each part).
func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func (m *requestMetrics) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w}
		next.ServeHTTP(rec, r)
		// The route pattern, not the raw path, keeps label cardinality bounded.
		path := r.Pattern
		if path == "" || path == "/" {
			path = "unmatched"
		}
		code := rec.code
		if code == 0 {
			code = http.StatusOK
		}
		m.requests.WithLabelValues(path, r.Method, strconv.Itoa(code)).Inc()
		m.duration.WithLabelValues(path, r.Method).Observe(time.Since(start).Seconds())
	})
}
