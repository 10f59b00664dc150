package cni

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// The plugin talks to the agent with its own small client and wire structs
// instead of pkg/client and the Cilium models: the models package pulls in
// go-openapi/strfmt and govalidator, whose package initialisation costs
// about 5 ms of CPU in every plugin process (measured with
// GODEBUG=inittrace=1), and a node runs one plugin process per pod
// attachment, 50 at once when 50 pods are scheduled. The JSON field names
// are those of api/v1/openapi.yaml; test/cni checks them against the real
// agent, and the unit tests against the models package.

// agentClient is a client of the agent's REST API on its unix socket.
type agentClient struct {
	socket string
	http   *http.Client
}

// APIError is a non-2xx answer of the agent.
type APIError struct {
	Code    int
	Message string
}

func (e *APIError) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("agent answered %d %s", e.Code, http.StatusText(e.Code))
	}
	return fmt.Sprintf("agent answered %d: %s", e.Code, e.Message)
}

func isNotFound(err error) bool {
	var apiErr *APIError
	return errors.As(err, &apiErr) && apiErr.Code == http.StatusNotFound
}

// newAgentClient accepts "unix:///path", "unix:/path" or "/path".
func newAgentClient(host string) (*agentClient, error) {
	socket := host
	switch {
	case strings.HasPrefix(socket, "unix://"):
		socket = strings.TrimPrefix(socket, "unix://")
	case strings.HasPrefix(socket, "unix:"):
		socket = strings.TrimPrefix(socket, "unix:")
	case strings.Contains(socket, "://"):
		return nil, fmt.Errorf("agent socket %q: only unix sockets are supported", host)
	}
	if !strings.HasPrefix(socket, "/") {
		return nil, fmt.Errorf("agent socket %q: not an absolute path", host)
	}
	transport := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		IdleConnTimeout: 10 * time.Second,
	}
	return &agentClient{socket: socket, http: &http.Client{Transport: transport}}, nil
}

// do sends one request below /v1 and decodes a 2xx answer into out.
func (c *agentClient) do(ctx context.Context, method, path string, query url.Values, header http.Header, body, out any) error {
	var reader io.Reader
	if body != nil {
		buf, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("encode %s %s: %w", method, path, err)
		}
		reader = bytes.NewReader(buf)
	}
	u := "http://agent/v1" + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, reader)
	if err != nil {
		return fmt.Errorf("build %s %s: %w", method, path, err)
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s via %s: %w", method, path, c.socket, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("read answer of %s %s: %w", method, path, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return &APIError{Code: resp.StatusCode, Message: errorMessage(data)}
	}
	if out == nil || len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("decode answer of %s %s: %w", method, path, err)
	}
	return nil
}

// errorMessage reads an error body: a JSON string (the Cilium API's form)
// or an object with a message.
func errorMessage(data []byte) string {
	data = bytes.TrimSpace(data)
	var s string
	if json.Unmarshal(data, &s) == nil {
		return s
	}
	var obj struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(data, &obj) == nil && obj.Message != "" {
		return obj.Message
	}
	return string(data)
}

// Wire structs: the subset of the Cilium v1 models the plugin reads or
// sends, with the same JSON names.

type addressPair struct {
	IPV4               string `json:"ipv4,omitempty"`
	IPV4ExpirationUUID string `json:"ipv4-expiration-uuid,omitempty"`
	IPV6               string `json:"ipv6,omitempty"`
	IPV6ExpirationUUID string `json:"ipv6-expiration-uuid,omitempty"`
}

type nodeAddressingElement struct {
	Enabled    bool   `json:"enabled,omitempty"`
	IP         string `json:"ip,omitempty"`
	AllocRange string `json:"alloc-range,omitempty"`
}

type nodeAddressing struct {
	IPV4 *nodeAddressingElement `json:"ipv4,omitempty"`
	IPV6 *nodeAddressingElement `json:"ipv6,omitempty"`
}

type ipamAddressResponse struct {
	IP             string `json:"ip,omitempty"`
	Gateway        string `json:"gateway,omitempty"`
	ExpirationUUID string `json:"expiration-uuid,omitempty"`
}

type ipamResponse struct {
	Address        *addressPair         `json:"address"`
	HostAddressing *nodeAddressing      `json:"host-addressing"`
	IPV4           *ipamAddressResponse `json:"ipv4,omitempty"`
	IPV6           *ipamAddressResponse `json:"ipv6,omitempty"`
}

type daemonConfiguration struct {
	Status *struct {
		Addressing *nodeAddressing `json:"addressing,omitempty"`
		DeviceMTU  int64           `json:"deviceMTU,omitempty"`
	} `json:"status,omitempty"`
}

type endpointDatapathConfiguration struct {
	InstallEndpointRoute bool `json:"install-endpoint-route,omitempty"`
}

type endpointChangeRequest struct {
	Addressing             *addressPair                   `json:"addressing,omitempty"`
	ContainerID            string                         `json:"container-id,omitempty"`
	ContainerInterfaceName string                         `json:"container-interface-name,omitempty"`
	DatapathConfiguration  *endpointDatapathConfiguration `json:"datapath-configuration,omitempty"`
	HostMac                string                         `json:"host-mac,omitempty"`
	InterfaceIndex         int64                          `json:"interface-index,omitempty"`
	InterfaceName          string                         `json:"interface-name,omitempty"`
	K8sNamespace           string                         `json:"k8s-namespace,omitempty"`
	K8sPodName             string                         `json:"k8s-pod-name,omitempty"`
	K8sUID                 string                         `json:"k8s-uid,omitempty"`
	Mac                    string                         `json:"mac,omitempty"`
	Properties             map[string]any                 `json:"properties,omitempty"`
	State                  string                         `json:"state"`
	SyncBuildEndpoint      bool                           `json:"sync-build-endpoint,omitempty"`
}

type endpoint struct {
	ID     int64 `json:"id,omitempty"`
	Status *struct {
		ExternalIdentifiers *struct {
			ContainerID string `json:"container-id,omitempty"`
		} `json:"external-identifiers,omitempty"`
		Networking *struct {
			ContainerInterfaceName string `json:"container-interface-name,omitempty"`
		} `json:"networking,omitempty"`
	} `json:"status,omitempty"`
}

type endpointHealth struct {
	Bpf           string `json:"bpf,omitempty"`
	OverallHealth string `json:"overallHealth,omitempty"`
	Policy        string `json:"policy,omitempty"`
}

// The calls, as cilium-cni makes them.

func (c *agentClient) configGet(ctx context.Context) (*daemonConfiguration, error) {
	var cfg daemonConfiguration
	if err := c.do(ctx, http.MethodGet, "/config", nil, nil, nil, &cfg); err != nil {
		return nil, fmt.Errorf("get agent config: %w", err)
	}
	return &cfg, nil
}

func (c *agentClient) ipamAllocate(ctx context.Context, owner string) (*ipamResponse, error) {
	var resp ipamResponse
	q := url.Values{"owner": []string{owner}}
	h := http.Header{"Expiration": []string{"true"}}
	if err := c.do(ctx, http.MethodPost, "/ipam", q, h, nil, &resp); err != nil {
		return nil, fmt.Errorf("allocate address for %q: %w", owner, err)
	}
	return &resp, nil
}

func (c *agentClient) ipamRelease(ctx context.Context, ip string) error {
	if err := c.do(ctx, http.MethodDelete, "/ipam/"+url.PathEscape(ip), nil, nil, nil, nil); err != nil {
		return fmt.Errorf("release address %s: %w", ip, err)
	}
	return nil
}

func (c *agentClient) endpointPut(ctx context.Context, id string, req *endpointChangeRequest) error {
	if err := c.do(ctx, http.MethodPut, "/endpoint/"+url.PathEscape(id), nil, nil, req, nil); err != nil {
		return fmt.Errorf("create endpoint %s: %w", id, err)
	}
	return nil
}

func (c *agentClient) endpointList(ctx context.Context) ([]*endpoint, error) {
	var eps []*endpoint
	if err := c.do(ctx, http.MethodGet, "/endpoint", nil, nil, nil, &eps); err != nil {
		return nil, fmt.Errorf("list endpoints: %w", err)
	}
	return eps, nil
}

func (c *agentClient) endpointDelete(ctx context.Context, id string) error {
	if err := c.do(ctx, http.MethodDelete, "/endpoint/"+url.PathEscape(id), nil, nil, nil, nil); err != nil {
		return fmt.Errorf("delete endpoint %s: %w", id, err)
	}
	return nil
}

func (c *agentClient) endpointDeleteByContainerID(ctx context.Context, containerID string) error {
	body := map[string]string{"container-id": containerID}
	if err := c.do(ctx, http.MethodDelete, "/endpoint", nil, nil, body, nil); err != nil {
		return fmt.Errorf("delete endpoints of container %s: %w", containerID, err)
	}
	return nil
}

func (c *agentClient) endpointHealthz(ctx context.Context, id string) (*endpointHealth, error) {
	var h endpointHealth
	if err := c.do(ctx, http.MethodGet, "/endpoint/"+url.PathEscape(id)+"/healthz", nil, nil, nil, &h); err != nil {
		return nil, fmt.Errorf("endpoint %s health: %w", id, err)
	}
	return &h, nil
}
