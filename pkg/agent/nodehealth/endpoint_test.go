package nodehealth

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/cilium/hive/cell"

	"github.com/tendril-net/tendril/pkg/agent/agentendpoints"
	"github.com/tendril-net/tendril/pkg/endpoint"
)

// notStartedWiring answers ErrNotStarted to its first `pending` lookups,
// then fails with `then`: what the agent's endpoints do while the restore
// runs, without a namespace or a kernel.
type notStartedWiring struct {
	mu      sync.Mutex
	pending int
	lookups int
	then    error
}

func (w *notStartedWiring) LookupEndpoint(string) (*endpoint.Endpoint, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lookups++
	if w.lookups <= w.pending {
		return nil, fmt.Errorf("look up: %w", agentendpoints.ErrNotStarted)
	}
	return nil, w.then
}

func (w *notStartedWiring) CreateHealthEndpoint(context.Context, string, string, string) (*endpoint.Endpoint, error) {
	return nil, errors.New("not expected")
}

func (w *notStartedWiring) DeleteHealthEndpoint(context.Context, string, string, string) error {
	return errors.New("not expected")
}

// recordedHealth keeps what a job reports.
type recordedHealth struct {
	mu       sync.Mutex
	degraded []string
}

func (h *recordedHealth) OK(string)      {}
func (h *recordedHealth) Stopped(string) {}
func (h *recordedHealth) Degraded(reason string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.degraded = append(h.degraded, fmt.Sprintf("%s: %v", reason, err))
}
func (h *recordedHealth) NewScope(string) cell.Health { return h }
func (h *recordedHealth) Close()                      {}

// TestHealthEndpointWaitsForTheRestore: while the endpoints are not
// restored the job waits without reporting degraded (it runs on every
// agent by default, and every start passes through this), then reports
// a real failure; a stop while it waits is no failure.
func TestHealthEndpointWaitsForTheRestore(t *testing.T) {
	w := &notStartedWiring{pending: 3, then: errors.New("lookup broke")}
	h := NewHealthEndpoint("n1", "tendril-health-test", 4240, w, slog.New(slog.DiscardHandler))
	var rec recordedHealth
	err := h.Run(context.Background(), &rec)
	if err == nil || !errors.Is(err, w.then) {
		t.Fatalf("Run: %v, want the lookup's failure", err)
	}
	if w.lookups != 4 {
		t.Errorf("%d lookups, want 3 not started then 1", w.lookups)
	}
	if len(rec.degraded) != 1 {
		t.Errorf("degraded reports %q, want only the real failure's", rec.degraded)
	}

	w = &notStartedWiring{pending: 1 << 30}
	h = NewHealthEndpoint("n1", "tendril-health-test", 4240, w, slog.New(slog.DiscardHandler))
	rec = recordedHealth{}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if err := h.Run(ctx, &rec); err != nil {
		t.Errorf("Run stopped while waiting: %v, want nil", err)
	}
	if len(rec.degraded) != 0 {
		t.Errorf("degraded while waiting: %q", rec.degraded)
	}
}
