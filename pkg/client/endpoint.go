package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"github.com/cilium/cilium/api/v1/models"
)

// endpointPath is the API path of one endpoint; id is any ID form the API
// accepts (numeric, container-id:, cni-attachment-id:, pod-name:, ...).
func endpointPath(id string) string {
	return "/endpoint/" + url.PathEscape(id)
}

// EndpointPut creates an endpoint (PUT /v1/endpoint/{id}). With
// req.SyncBuildEndpoint the agent answers only once the endpoint's datapath
// is ready. The answer is the endpoint as the agent created it (the agent
// assigns the numeric ID when id is "cilium-local:0").
func (c *Client) EndpointPut(ctx context.Context, id string, req *models.EndpointChangeRequest) (*models.Endpoint, error) {
	var ep models.Endpoint
	if err := c.Do(ctx, http.MethodPut, endpointPath(id), nil, nil, req, &ep); err != nil {
		return nil, fmt.Errorf("create endpoint %s: %w", id, err)
	}
	return &ep, nil
}

// EndpointGet reads one endpoint.
func (c *Client) EndpointGet(ctx context.Context, id string) (*models.Endpoint, error) {
	var ep models.Endpoint
	if err := c.Do(ctx, http.MethodGet, endpointPath(id), nil, nil, nil, &ep); err != nil {
		return nil, fmt.Errorf("get endpoint %s: %w", id, err)
	}
	return &ep, nil
}

// EndpointList lists every endpoint of the agent.
func (c *Client) EndpointList(ctx context.Context) ([]*models.Endpoint, error) {
	var eps []*models.Endpoint
	if err := c.Do(ctx, http.MethodGet, "/endpoint", nil, nil, nil, &eps); err != nil {
		return nil, fmt.Errorf("list endpoints: %w", err)
	}
	return eps, nil
}

// EndpointPatch changes an existing endpoint (PATCH /v1/endpoint/{id}).
func (c *Client) EndpointPatch(ctx context.Context, id string, req *models.EndpointChangeRequest) error {
	if err := c.Do(ctx, http.MethodPatch, endpointPath(id), nil, nil, req, nil); err != nil {
		return fmt.Errorf("patch endpoint %s: %w", id, err)
	}
	return nil
}

// EndpointDelete deletes one endpoint (DELETE /v1/endpoint/{id}); the agent
// releases its addresses.
func (c *Client) EndpointDelete(ctx context.Context, id string) error {
	if err := c.Do(ctx, http.MethodDelete, endpointPath(id), nil, nil, nil, nil); err != nil {
		return fmt.Errorf("delete endpoint %s: %w", id, err)
	}
	return nil
}

// EndpointDeleteByContainerID deletes the endpoints of a container
// (DELETE /v1/endpoint with {"container-id": ...}), as cilium-cni's DEL does.
func (c *Client) EndpointDeleteByContainerID(ctx context.Context, containerID string) error {
	req := &models.EndpointBatchDeleteRequest{ContainerID: containerID}
	if err := c.Do(ctx, http.MethodDelete, "/endpoint", nil, nil, req, nil); err != nil {
		return fmt.Errorf("delete endpoints of container %s: %w", containerID, err)
	}
	return nil
}

// EndpointHealthz reads an endpoint's health (GET /v1/endpoint/{id}/healthz).
func (c *Client) EndpointHealthz(ctx context.Context, id string) (*models.EndpointHealth, error) {
	var h models.EndpointHealth
	if err := c.Do(ctx, http.MethodGet, endpointPath(id)+"/healthz", nil, nil, nil, &h); err != nil {
		return nil, fmt.Errorf("endpoint %s health: %w", id, err)
	}
	return &h, nil
}

// ConfigGet reads the agent's configuration (GET /v1/config), which carries
// the node's addressing, datapath mode and device MTU.
func (c *Client) ConfigGet(ctx context.Context) (*models.DaemonConfiguration, error) {
	var cfg models.DaemonConfiguration
	if err := c.Do(ctx, http.MethodGet, "/config", nil, nil, nil, &cfg); err != nil {
		return nil, fmt.Errorf("get agent config: %w", err)
	}
	return &cfg, nil
}
