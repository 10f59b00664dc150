package agent

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/tendril-net/tendril/pkg/client"
)

// TestServiceAPIEmpty: with no service, GET /v1/service answers 200 and
// an empty JSON array (not null), and an unknown ID is 404.
func TestServiceAPIEmpty(t *testing.T) {
	_, c := startAgent(t, nil)
	ctx := context.Background()
	var raw json.RawMessage
	if err := c.Do(ctx, http.MethodGet, "/service", nil, nil, nil, &raw); err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(raw)) != "[]" {
		t.Fatalf("GET /v1/service = %s, want []", raw)
	}
	if err := c.Do(ctx, http.MethodGet, "/service/1", nil, nil, nil, &raw); !client.IsNotFound(err) {
		t.Fatalf("GET /v1/service/1 = %v, want not found", err)
	}
}
