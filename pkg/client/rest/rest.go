// Package rest is the transport of the agent's REST API: JSON over HTTP on
// the agent's unix socket, errors as *APIError. It imports no API models,
// so a short-lived process (the CNI plugin, exec'd once per pod) pays no
// package initialisation for them; pkg/client adds the typed calls.
package rest

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
	"os"
	"strings"
	"time"
)

// DefaultSocket is where the agent serves its API unless told otherwise.
const DefaultSocket = "/var/run/tendril/tendril.sock"

// Client sends requests to one agent.
type Client struct {
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

// IsNotFound reports whether err is an API error with code 404.
func IsNotFound(err error) bool {
	var apiErr *APIError
	return errors.As(err, &apiErr) && apiErr.Code == http.StatusNotFound
}

// SocketFromHost turns "unix:///path", "unix:/path" or "/path" into a socket
// path; an empty host means the TENDRIL_SOCK environment variable, then the
// default socket.
func SocketFromHost(host string) (string, error) {
	if host == "" {
		host = os.Getenv("TENDRIL_SOCK")
	}
	if host == "" {
		return DefaultSocket, nil
	}
	switch {
	case strings.HasPrefix(host, "unix://"):
		host = strings.TrimPrefix(host, "unix://")
	case strings.HasPrefix(host, "unix:"):
		host = strings.TrimPrefix(host, "unix:")
	case strings.Contains(host, "://"):
		return "", fmt.Errorf("host %q: only unix:// sockets are supported", host)
	}
	if host == "" {
		return "", fmt.Errorf("host %q: empty socket path", host)
	}
	return host, nil
}

// New returns a client for the agent at host (see SocketFromHost).
func New(host string) (*Client, error) {
	socket, err := SocketFromHost(host)
	if err != nil {
		return nil, err
	}
	transport := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     30 * time.Second,
	}
	return &Client{socket: socket, http: &http.Client{Transport: transport}}, nil
}

// Socket returns the path of the agent's socket.
func (c *Client) Socket() string { return c.socket }

// Do sends one request to path (below /v1, e.g. "/healthz") and decodes a
// 2xx JSON answer into out when out is not nil. A non-2xx answer is an
// *APIError carrying the agent's message.
func (c *Client) Do(ctx context.Context, method, path string, query url.Values, header http.Header, body, out any) error {
	var reader io.Reader
	if body != nil {
		buf, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("encode %s %s body: %w", method, path, err)
		}
		reader = bytes.NewReader(buf)
	}
	u := "http://tendril/v1" + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, reader)
	if err != nil {
		return fmt.Errorf("build %s %s: %w", method, path, err)
	}
	for k, vs := range header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
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
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
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

// errorMessage extracts the message of an error body: the agent answers a
// JSON string (as the Cilium API does) or an object with a "message".
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
