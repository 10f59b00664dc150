package agent

import (
	"context"
	"errors"
	"net/http"
	"net/netip"
	"net/url"
	"testing"
	"time"

	"github.com/cilium/cilium/api/v1/models"

	"github.com/tendril-net/tendril/pkg/client"
	"github.com/tendril-net/tendril/pkg/endpoint"
)

func TestIPAMAndEndpointAPI(t *testing.T) {
	_, c := startAgent(t, map[string]string{"ipv4-range": "10.77.0.0/29", "ipv6-range": "fd00:77::/120"})
	ctx := context.Background()

	// Allocation with expiration for a pod, idempotent for the same owner.
	first, err := c.IPAMAllocate(ctx, "", "ns/web", true)
	if err != nil {
		t.Fatal(err)
	}
	if first.Address.IPV4 != "10.77.0.2" || first.Address.IPV6 != "fd00:77::2" || first.IPV4.ExpirationUUID == "" ||
		first.HostAddressing.IPV4.IP != "10.77.0.1" || first.IPV4.Gateway != "10.77.0.1" {
		t.Fatalf("allocation = %+v %+v %+v", first.Address, first.IPV4, first.HostAddressing.IPV4)
	}
	again, err := c.IPAMAllocate(ctx, "", "ns/web", true)
	if err != nil || again.Address.IPV4 != first.Address.IPV4 {
		t.Fatalf("same owner again = %+v, %v", again, err)
	}

	// Endpoint for it, claiming the expiration.
	state := models.EndpointStateWaitingDashForDashIdentity
	req := &models.EndpointChangeRequest{
		ContainerID: "abc123", ContainerInterfaceName: "eth0", InterfaceName: "tdrfake0",
		K8sNamespace: "ns", K8sPodName: "web", SyncBuildEndpoint: true, State: &state,
		Labels: models.Labels{"k8s:app=web"},
		Addressing: &models.AddressPair{IPV4: first.Address.IPV4, IPV6: first.Address.IPV6,
			IPV4ExpirationUUID: first.IPV4.ExpirationUUID, IPV6ExpirationUUID: first.IPV6.ExpirationUUID},
	}
	ep, err := c.EndpointPut(ctx, "cilium-local:0", req)
	if err != nil {
		t.Fatal(err)
	}
	if ep.ID != 1 || *ep.Status.State != models.EndpointStateReady {
		t.Fatalf("endpoint = %d %s", ep.ID, *ep.Status.State)
	}
	for _, id := range []string{"1", "container-id:abc123", "cni-attachment-id:abc123:eth0", "pod-name:ns/web"} {
		got, err := c.EndpointGet(ctx, id)
		if err != nil || got.ID != 1 {
			t.Errorf("get %s = %v", id, err)
		}
	}
	h, err := c.EndpointHealthz(ctx, "cni-attachment-id:abc123:eth0")
	if err != nil || h.OverallHealth != models.EndpointHealthStatusOK {
		t.Fatalf("healthz = %+v, %v", h, err)
	}

	tests := []struct {
		name   string
		method string
		path   string
		query  url.Values
		body   any
		code   int
	}{
		{"second endpoint same attachment", "PUT", "/endpoint/0", nil, req, 409},
		{"endpoint without address", "PUT", "/endpoint/0", nil, &models.EndpointChangeRequest{ContainerID: "x"}, 400},
		{"malformed endpoint body", "PUT", "/endpoint/0", nil, "[1,2", 400},
		{"bad endpoint id", "GET", "/endpoint/abc", nil, nil, 400},
		{"unknown endpoint", "GET", "/endpoint/99", nil, nil, 404},
		{"unknown pod", "GET", "/endpoint/pod-name:ns%2Fnope", nil, nil, 404},
		{"unsupported id form", "GET", "/endpoint/docker-endpoint:x", nil, nil, 400},
		{"log", "GET", "/endpoint/1/log", nil, nil, 200},
		{"labels", "GET", "/endpoint/1/labels", nil, nil, 200},
		{"config", "GET", "/endpoint/1/config", nil, nil, 200},
		{"config patch unknown option", "PATCH", "/endpoint/1/config", nil, &models.EndpointConfigurationSpec{Options: models.ConfigurationMap{"X": "1"}}, 400},
		{"patch cannot change address", "PATCH", "/endpoint/1", nil, &models.EndpointChangeRequest{Addressing: &models.AddressPair{IPV4: "10.77.0.5"}}, 400},
		{"patch labels", "PATCH", "/endpoint/1/labels", nil, &models.LabelConfigurationSpec{User: models.Labels{"k8s:app=web2"}}, 200},
		{"ip taken", "POST", "/ipam/10.77.0.2", nil, nil, 409},
		{"ip out of range", "POST", "/ipam/10.99.0.2", nil, nil, 400},
		{"ip malformed", "POST", "/ipam/not-an-ip", nil, nil, 400},
		{"ip specific ok", "POST", "/ipam/10.77.0.5", url.Values{"owner": {"ns/x"}}, nil, 200},
		{"release endpoint ip refused", "DELETE", "/ipam/10.77.0.2", nil, nil, 403},
		{"release ok", "DELETE", "/ipam/10.77.0.5", nil, nil, 200},
		{"release unknown", "DELETE", "/ipam/10.77.0.5", nil, nil, 404},
		{"bad family", "POST", "/ipam", url.Values{"family": {"ipx"}}, nil, 400},
		{"batch delete needs container id", "DELETE", "/endpoint", nil, &models.EndpointBatchDeleteRequest{}, 400},
		{"batch delete unknown container", "DELETE", "/endpoint", nil, &models.EndpointBatchDeleteRequest{ContainerID: "nope"}, 404},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := c.Do(ctx, tt.method, tt.path, tt.query, nil, tt.body, nil)
			code := 200
			if err != nil {
				apiErr, ok := err.(*client.APIError)
				if !ok {
					t.Fatalf("%v", err)
				}
				code = apiErr.Code
			}
			if code != tt.code {
				t.Fatalf("%s %s = %d (%v), want %d", tt.method, tt.path, code, err, tt.code)
			}
		})
	}
	got, _ := c.EndpointGet(ctx, "1")
	if len(got.Status.Labels.SecurityRelevant) != 1 || got.Status.Labels.SecurityRelevant[0] != "k8s:app=web2" {
		t.Fatalf("labels after patch = %v", got.Status.Labels.SecurityRelevant)
	}

	// Exhaust the /29 (5 usable, one held by ns/web): the pool says so, and a
	// failed dual-stack request keeps nothing.
	for i := 0; i < 4; i++ {
		if _, err := c.IPAMAllocate(ctx, "ipv4", "fill/"+string(rune('a'+i)), false); err != nil {
			t.Fatal(err)
		}
	}
	_, err = c.IPAMAllocate(ctx, "", "fill/z", false)
	if apiErr, ok := errAs(err); !ok || apiErr.Code != http.StatusBadGateway {
		t.Fatalf("exhausted = %v", err)
	}
	var st models.StatusResponse
	if err := c.Do(ctx, "GET", "/healthz", nil, nil, nil, &st); err != nil {
		t.Fatal(err)
	}
	for ip, owner := range st.Ipam.Allocations {
		if owner == "fill/z" {
			t.Fatalf("failed request kept %s", ip)
		}
	}

	// Delete by container: the endpoint and its addresses go.
	if err := c.EndpointDeleteByContainerID(ctx, "abc123"); err != nil {
		t.Fatal(err)
	}
	if eps, _ := c.EndpointList(ctx); len(eps) != 0 {
		t.Fatalf("endpoints left: %d", len(eps))
	}
	var after models.StatusResponse // fresh: decoding merges into an existing map
	if err := c.Do(ctx, "GET", "/healthz", nil, nil, nil, &after); err != nil {
		t.Fatal(err)
	}
	if _, held := after.Ipam.Allocations["10.77.0.2"]; held {
		t.Fatalf("endpoint's address not released: %v", after.Ipam.Allocations)
	}
}

func errAs(err error) (*client.APIError, bool) {
	var e *client.APIError
	ok := errors.As(err, &e)
	return e, ok
}

// blockingBuild holds every endpoint build until release is closed.
type blockingBuild struct {
	started chan struct{}
	release chan struct{}
}

func (b *blockingBuild) Regenerate(ctx context.Context, _ *endpoint.Endpoint) error {
	select {
	case b.started <- struct{}{}:
	default:
	}
	<-b.release
	return nil
}

func (b *blockingBuild) Remove(context.Context, *endpoint.Endpoint) error { return nil }

// TestEndpointPutClientGone: a PUT whose client gives up during the
// synchronous build (a CNI plugin's timeout) leaves no endpoint behind: the
// client never learns its ID and rolls back its own side.
func TestEndpointPutClientGone(t *testing.T) {
	a, c := startAgent(t, map[string]string{"ipv4-range": "10.0.0.0/24", "ipv6-range": "none"})
	build := &blockingBuild{started: make(chan struct{}, 1), release: make(chan struct{})}
	a.endpoints.AddRegenerateHook(build)
	state := models.EndpointStateWaitingDashForDashIdentity
	req := &models.EndpointChangeRequest{
		ContainerID: "gone1", ContainerInterfaceName: "eth0", InterfaceName: "tdrfake1", InterfaceIndex: 7,
		SyncBuildEndpoint: true, State: &state, Addressing: &models.AddressPair{IPV4: "10.0.0.9"},
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := c.EndpointPut(ctx, "cilium-local:0", req)
		errc <- err
	}()
	select {
	case <-build.started:
	case err := <-errc:
		t.Fatalf("PUT ended before the build started: %v", err)
	}
	cancel() // the plugin's timeout
	if err := <-errc; err == nil {
		t.Fatal("PUT succeeded although its client gave up")
	}
	close(build.release)
	// The handler finishes the build, sees its client gone and deletes
	// the endpoint; the deadline only keeps a broken agent from hanging.
	deadline := time.Now().Add(10 * time.Second)
	for {
		eps, err := c.EndpointList(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(eps) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("endpoint %d stayed after its client went away", eps[0].ID)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, held := a.endpoints.IPAM().Lookup(netip.MustParseAddr("10.0.0.9")); held {
		t.Error("the endpoint's address stayed allocated")
	}
}
