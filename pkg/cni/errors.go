package cni

import (
	"errors"
	"fmt"
	"net"
	"syscall"

	"github.com/containernetworking/cni/pkg/types"
)

// The plugin's own error codes (the spec leaves 100 and up to plugins).
const (
	// ErrAllocation: the agent could not give the pod an address (pool
	// exhausted, family disabled).
	ErrAllocation uint = 100
	// ErrEndpoint: the agent refused or failed to create the endpoint.
	ErrEndpoint uint = 101
	// ErrLink: creating or configuring the veth pair failed.
	ErrLink uint = 102
	// ErrCheck: CHECK found the attachment not as ADD left it.
	ErrCheck uint = 103
	// ErrAgent: the agent answered something the plugin cannot use.
	ErrAgent uint = 104
)

// STATUS codes of the spec.
const (
	// ErrPluginNotAvailable: the plugin cannot serve ADD right now.
	ErrPluginNotAvailable uint = 50
)

// cniError turns err into a *types.Error: an existing one is kept; an agent
// that cannot be reached is "try again later" (11), because the runtime
// retries and the agent may be restarting; anything else gets code.
func cniError(code uint, msg string, err error) *types.Error {
	var te *types.Error
	if errors.As(err, &te) {
		return te
	}
	if agentUnreachable(err) {
		return types.NewError(types.ErrTryAgainLater, msg+": agent not reachable", err.Error())
	}
	return types.NewError(code, msg, err.Error())
}

// agentUnreachable reports whether err means no agent answered (no socket,
// connection refused), as opposed to an agent that answered with an error.
func agentUnreachable(err error) bool {
	var apiErr *APIError
	if errors.As(err, &apiErr) {
		return apiErr.Code == 503
	}
	var opErr *net.OpError
	return errors.As(err, &opErr) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT)
}

// apiCode is the HTTP status of an agent error, 0 when err is no API error.
func apiCode(err error) int {
	var apiErr *APIError
	if errors.As(err, &apiErr) {
		return apiErr.Code
	}
	return 0
}

func errorf(code uint, format string, args ...any) *types.Error {
	return types.NewError(code, fmt.Sprintf(format, args...), "")
}
