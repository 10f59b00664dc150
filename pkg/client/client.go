// Package client talks to a Tendril agent's REST API (Cilium v1 paths and
// models) over its unix socket. The CLI and the tests use it; the transport
// is pkg/client/rest.
package client

import (
	"github.com/tendril-net/tendril/pkg/client/rest"
)

// DefaultSocket is where the agent serves its API unless told otherwise.
const DefaultSocket = rest.DefaultSocket

// Client is a REST client for one agent: the transport plus typed calls.
type Client struct {
	*rest.Client
}

// APIError is a non-2xx answer of the agent.
type APIError = rest.APIError

// IsNotFound reports whether err is an API error with code 404.
func IsNotFound(err error) bool { return rest.IsNotFound(err) }

// SocketFromHost turns "unix:///path", "unix:/path" or "/path" into a socket
// path (empty: $TENDRIL_SOCK, then the default).
func SocketFromHost(host string) (string, error) { return rest.SocketFromHost(host) }

// New returns a client for the agent at host.
func New(host string) (*Client, error) {
	c, err := rest.New(host)
	if err != nil {
		return nil, err
	}
	return &Client{Client: c}, nil
}
