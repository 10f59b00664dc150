package client

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/cilium/cilium/api/v1/models"
)

// recorded is one request as the server saw it.
type recorded struct {
	method, path, query, expiration, body string
}

// serve answers every request with code and answer, recording it.
func serve(t *testing.T, code int, answer any) (*Client, *[]recorded) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "a.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var reqs []recorded
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		reqs = append(reqs, recorded{r.Method, r.URL.EscapedPath(), r.URL.RawQuery, r.Header.Get("expiration"), string(b)})
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(answer)
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
	c, err := New("unix://" + sock)
	if err != nil {
		t.Fatal(err)
	}
	return c, &reqs
}

func TestIPAMCalls(t *testing.T) {
	ctx := context.Background()
	c, reqs := serve(t, http.StatusCreated, &models.IPAMResponse{Address: &models.AddressPair{IPV4: "10.0.0.5"}})
	resp, err := c.IPAMAllocate(ctx, "ipv4", "ns/pod", true)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Address.IPV4 != "10.0.0.5" {
		t.Errorf("answer %+v", resp.Address)
	}
	if err := c.IPAMAllocateIP(ctx, "10.0.0.9", "ns/other"); err != nil {
		t.Fatal(err)
	}
	if err := c.IPAMRelease(ctx, "fd00::9"); err != nil {
		t.Fatal(err)
	}
	want := []recorded{
		{"POST", "/v1/ipam", "family=ipv4&owner=ns%2Fpod", "true", ""},
		{"POST", "/v1/ipam/10.0.0.9", "owner=ns%2Fother", "", ""},
		{"DELETE", "/v1/ipam/fd00::9", "", "", ""},
	}
	for i, w := range want {
		if (*reqs)[i] != w {
			t.Errorf("request %d = %+v, want %+v", i, (*reqs)[i], w)
		}
	}
}

func TestEndpointCalls(t *testing.T) {
	ctx := context.Background()
	c, reqs := serve(t, http.StatusCreated, &models.Endpoint{ID: 42})
	ep, err := c.EndpointPut(ctx, "cilium-local:0", &models.EndpointChangeRequest{ContainerID: "c1", SyncBuildEndpoint: true})
	if err != nil {
		t.Fatal(err)
	}
	if ep.ID != 42 {
		t.Errorf("endpoint ID %d, want 42", ep.ID)
	}
	if err := c.EndpointDeleteByContainerID(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.EndpointHealthz(ctx, "cni-attachment-id:c1:eth0"); err != nil {
		t.Fatal(err)
	}
	got := *reqs
	if got[0].method != "PUT" || got[0].path != "/v1/endpoint/cilium-local:0" {
		t.Errorf("PUT request %+v", got[0])
	}
	var body models.EndpointChangeRequest
	if err := json.Unmarshal([]byte(got[0].body), &body); err != nil || body.ContainerID != "c1" || !body.SyncBuildEndpoint {
		t.Errorf("PUT body %s (%v)", got[0].body, err)
	}
	if got[1].method != "DELETE" || got[1].path != "/v1/endpoint" || got[1].body != `{"container-id":"c1"}` {
		t.Errorf("batch delete %+v", got[1])
	}
	if got[2].path != "/v1/endpoint/cni-attachment-id:c1:eth0/healthz" {
		t.Errorf("healthz path %q", got[2].path)
	}

	nf, _ := serve(t, http.StatusNotFound, "endpoint not found")
	err = nf.EndpointDelete(ctx, "7")
	if !IsNotFound(err) {
		t.Fatalf("404 gave %v, want a not-found API error", err)
	}
	if _, err := nf.EndpointList(ctx); err == nil || !IsNotFound(err) {
		t.Errorf("list on 404: %v", err)
	}
}
