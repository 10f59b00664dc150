package cni

import (
	"encoding/json"
	"strings"
)

// APIPrefix is the path of the agent's CNI endpoint; the command follows in
// lower case: POST /v1/cni/add, /del, /check, /status, /gc.
const APIPrefix = "/v1/cni/"

// CommandPath is the API path of a CNI command.
func CommandPath(command string) string { return APIPrefix + strings.ToLower(command) }

// Request is one CNI invocation as the plugin received it, forwarded whole
// to the agent: the CNI_* environment and the network configuration from
// stdin, whole (as JSON, compacted; with its prevResult and, for GC, its
// cni.dev/valid-attachments).
//
// Answers: 200 with the CNI result (ADD; already in the configuration's
// cniVersion, printed by the plugin as it is), 204 for the other commands,
// or an error status with an Error body that the plugin prints.
type Request struct {
	ContainerID string `json:"container-id,omitempty"`
	Netns       string `json:"netns,omitempty"`
	IfName      string `json:"ifname,omitempty"`
	Args        string `json:"args,omitempty"`
	Path        string `json:"path,omitempty"`
	// Config is the network configuration from stdin.
	Config json.RawMessage `json:"config"`
	// PluginNetNS identifies the network namespace the plugin runs in
	// ("device:inode" of /proc/self/ns/net). The agent creates the host
	// side of the pod's veth in its own namespace, so it refuses a plugin
	// that runs in another one (a socket of another node's agent).
	PluginNetNS string `json:"plugin-netns,omitempty"`
}

// StatusForCode is the HTTP status under which the agent answers a CNI
// error: 400 for the caller's input, 503 when the caller should try again,
// 500 for the rest. The body carries the CNI code either way; the status
// only helps tools that read the API without knowing CNI.
func StatusForCode(code uint) int {
	switch code {
	case ErrIncompatibleCNIVersion, ErrInvalidEnvironmentVariables, ErrDecodingFailure, ErrInvalidNetworkConfig:
		return 400
	case ErrTryAgainLater, ErrPluginNotAvailable:
		return 503
	}
	return 500
}
