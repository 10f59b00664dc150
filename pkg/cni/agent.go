package cni

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/tendril-net/tendril/pkg/client/rest"
)

// The plugin talks to the agent over pkg/client/rest with its own wire
// structs instead of pkg/client and the Cilium models: the models package pulls in
// go-openapi/strfmt and govalidator, whose package initialisation costs
// about 5 ms of CPU in every plugin process (measured with
// GODEBUG=inittrace=1), and a node runs one plugin process per pod
// attachment, 50 at once when 50 pods are scheduled. The JSON field names
// are those of api/v1/openapi.yaml; test/cni checks them against the real
// agent, and the unit tests against the models package.

// agentClient is a client of the agent's REST API on its unix socket, over
// the models-free transport.
type agentClient struct {
	*rest.Client
}

// APIError is a non-2xx answer of the agent.
type APIError = rest.APIError

func isNotFound(err error) bool { return rest.IsNotFound(err) }

// newAgentClient accepts "unix:///path", "unix:/path" or "/path".
func newAgentClient(host string) (*agentClient, error) {
	socket, err := rest.SocketFromHost(host)
	if err != nil {
		return nil, fmt.Errorf("agent socket: %w", err)
	}
	if !strings.HasPrefix(socket, "/") {
		return nil, fmt.Errorf("agent socket %q: not an absolute path", host)
	}
	c, err := rest.New(socket)
	if err != nil {
		return nil, err
	}
	return &agentClient{Client: c}, nil
}

// do sends one request below /v1 and decodes a 2xx answer into out.
func (c *agentClient) do(ctx context.Context, method, path string, query url.Values, header http.Header, body, out any) error {
	return c.Do(ctx, method, path, query, header, body, out)
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

func (c *agentClient) endpointHealthz(ctx context.Context, id string) (*endpointHealth, error) {
	var h endpointHealth
	if err := c.do(ctx, http.MethodGet, "/endpoint/"+url.PathEscape(id)+"/healthz", nil, nil, nil, &h); err != nil {
		return nil, fmt.Errorf("endpoint %s health: %w", id, err)
	}
	return &h, nil
}
