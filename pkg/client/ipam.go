package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"github.com/cilium/cilium/api/v1/models"
)

// IPAMAllocate asks the agent for the next free address (POST /v1/ipam). An
// empty family means every family the agent has enabled; owner names the
// holder (pod namespace/name). With expiration the agent releases the
// address again unless an endpoint claims it (by its expiration UUID) in time,
// so a plugin that dies between allocation and endpoint creation leaks
// nothing.
func (c *Client) IPAMAllocate(ctx context.Context, family, owner string, expiration bool) (*models.IPAMResponse, error) {
	q := url.Values{}
	if family != "" {
		q.Set("family", family)
	}
	if owner != "" {
		q.Set("owner", owner)
	}
	var h http.Header
	if expiration {
		h = http.Header{"expiration": []string{"true"}}
	}
	var resp models.IPAMResponse
	if err := c.Do(ctx, http.MethodPost, "/ipam", q, h, nil, &resp); err != nil {
		return nil, fmt.Errorf("allocate address for %q: %w", owner, err)
	}
	return &resp, nil
}

// IPAMAllocateIP reserves one specific address (POST /v1/ipam/{ip}).
func (c *Client) IPAMAllocateIP(ctx context.Context, ip, owner string) error {
	q := url.Values{}
	if owner != "" {
		q.Set("owner", owner)
	}
	if err := c.Do(ctx, http.MethodPost, "/ipam/"+url.PathEscape(ip), q, nil, nil, nil); err != nil {
		return fmt.Errorf("allocate address %s for %q: %w", ip, owner, err)
	}
	return nil
}

// IPAMRelease gives an address back (DELETE /v1/ipam/{ip}).
func (c *Client) IPAMRelease(ctx context.Context, ip string) error {
	if err := c.Do(ctx, http.MethodDelete, "/ipam/"+url.PathEscape(ip), nil, nil, nil, nil); err != nil {
		return fmt.Errorf("release address %s: %w", ip, err)
	}
	return nil
}
