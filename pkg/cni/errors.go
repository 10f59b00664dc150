package cni

import "fmt"

// Error codes of the CNI spec (1.1) that Tendril uses. They are defined
// here rather than taken from the CNI library so the plugin binary does not
// link it.
const (
	// ErrIncompatibleCNIVersion: the configuration's cniVersion is not
	// supported, or does not allow the command.
	ErrIncompatibleCNIVersion uint = 1
	// ErrInvalidEnvironmentVariables: a CNI_* variable is missing or
	// malformed. Also used for a CNI_NETNS that cannot be opened: the spec
	// has no code of its own for it (the CNI library's 8 is not in the
	// spec).
	ErrInvalidEnvironmentVariables uint = 4
	// ErrIOFailure: reading stdin or writing stdout failed.
	ErrIOFailure uint = 5
	// ErrDecodingFailure: the configuration or its prevResult is not
	// valid JSON of the right shape.
	ErrDecodingFailure uint = 6
	// ErrInvalidNetworkConfig: the configuration is decodable but wrong.
	ErrInvalidNetworkConfig uint = 7
	// ErrTryAgainLater: the agent is not reachable (restarting); the
	// runtime retries.
	ErrTryAgainLater uint = 11
	// ErrPluginNotAvailable: STATUS, the plugin cannot serve ADD now.
	ErrPluginNotAvailable uint = 50
	// ErrInternal: anything else.
	ErrInternal uint = 999
)

// Tendril's own codes (the spec leaves 100 and up to plugins).
const (
	// ErrAllocation: the agent could not give the pod an address (pool
	// exhausted, family disabled).
	ErrAllocation uint = 100
	// ErrEndpoint: the agent could not create or delete the endpoint.
	ErrEndpoint uint = 101
	// ErrLink: creating or configuring the veth, addresses or routes
	// failed.
	ErrLink uint = 102
	// ErrCheck: CHECK found the attachment not as ADD left it.
	ErrCheck uint = 103
	// ErrAgent: the agent's answer is unusable (e.g. an agent without the
	// /v1/cni endpoint).
	ErrAgent uint = 104
)

// Error is a CNI error as the spec prints it on stdout, and as the agent
// answers a failed command.
type Error struct {
	CNIVersion string `json:"cniVersion,omitempty"`
	Code       uint   `json:"code"`
	Msg        string `json:"msg"`
	Details    string `json:"details,omitempty"`
}

func (e *Error) Error() string {
	if e.Details == "" {
		return e.Msg
	}
	return e.Msg + "; " + e.Details
}

// NewError returns an *Error.
func NewError(code uint, msg, details string) *Error {
	return &Error{Code: code, Msg: msg, Details: details}
}

// Errorf returns an *Error with a formatted message and no details.
func Errorf(code uint, format string, args ...any) *Error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}
