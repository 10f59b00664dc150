// Package cni is the logic of the tendril-cni plugin: it creates a pod's
// veth pair, gets the pod's addresses from the agent, configures them and
// the routes inside the pod, and registers the pod as an endpoint with the
// agent over the agent's REST API (the same calls the stock cilium-cni
// makes). cmd/tendril-cni only hands the skel dispatcher to this package.
package cni

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
)

// PluginType is the "type" of a network configuration that runs this plugin.
const PluginType = "tendril-cni"

// DefaultAgentSocket is the agent's API socket unless the config names one.
const DefaultAgentSocket = "/var/run/tendril/tendril.sock"

// SupportedVersions are the CNI spec versions the plugin speaks.
func SupportedVersions() []string { return []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"} }

// PluginInfo reports SupportedVersions to the skel dispatcher (VERSION).
func PluginInfo() version.PluginInfo { return version.PluginSupports(SupportedVersions()...) }

// NetConf is the network configuration tendril-cni reads from stdin.
type NetConf struct {
	types.PluginConf

	// AgentSocket is the agent's API socket ("unix:///path" or a path).
	AgentSocket string `json:"agent-socket,omitempty"`
	// MTU of the pod's interface; 0 takes the agent's device MTU.
	MTU int `json:"mtu,omitempty"`
	// LogFile receives the plugin's log (the runtime keeps only stdout).
	LogFile string `json:"log-file,omitempty"`
}

// ParseConfig decodes and validates a network configuration. Errors are
// *types.Error with the spec's codes: 6 for undecodable JSON, 7 for an
// invalid configuration.
func ParseConfig(data []byte) (*NetConf, error) {
	conf := &NetConf{}
	if err := json.Unmarshal(data, conf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "decode network configuration", err.Error())
	}
	if conf.Type != PluginType {
		return nil, types.NewError(types.ErrInvalidNetworkConfig,
			fmt.Sprintf("network configuration type is %q, want %q", conf.Type, PluginType), "")
	}
	if conf.CNIVersion == "" {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, "network configuration has no cniVersion", "")
	}
	if conf.MTU != 0 && (conf.MTU < 1280 || conf.MTU > 65535) {
		return nil, types.NewError(types.ErrInvalidNetworkConfig,
			fmt.Sprintf("mtu %d: must be between 1280 and 65535", conf.MTU), "")
	}
	if conf.AgentSocket == "" {
		conf.AgentSocket = DefaultAgentSocket
	}
	if conf.RawPrevResult != nil {
		if err := version.ParsePrevResult(&conf.PluginConf); err != nil {
			return nil, types.NewError(types.ErrDecodingFailure, "decode prevResult", err.Error())
		}
	}
	return conf, nil
}

// PodArgs are the CNI_ARGS a container runtime (the kubelet) passes.
type PodArgs struct {
	types.CommonArgs
	K8S_POD_NAMESPACE          types.UnmarshallableString //nolint:revive // names are the wire format
	K8S_POD_NAME               types.UnmarshallableString //nolint:revive
	K8S_POD_INFRA_CONTAINER_ID types.UnmarshallableString //nolint:revive
	K8S_POD_UID                types.UnmarshallableString //nolint:revive
}

// ParseArgs decodes CNI_ARGS ("K=V;K=V"); unknown keys are ignored as the
// spec asks. A malformed string is error code 4.
func ParseArgs(args string) (*PodArgs, error) {
	a := &PodArgs{}
	a.IgnoreUnknown = true
	if err := types.LoadArgs(args, a); err != nil {
		return nil, types.NewError(types.ErrInvalidEnvironmentVariables, "parse CNI_ARGS", err.Error())
	}
	return a, nil
}

// Owner is the IPAM owner string of a pod: namespace/name, or the
// container ID outside Kubernetes.
func (a *PodArgs) Owner(containerID string) string {
	if a.K8S_POD_NAME != "" {
		return string(a.K8S_POD_NAMESPACE) + "/" + string(a.K8S_POD_NAME)
	}
	return containerID
}

// HostVethName is the host-side name of a pod's veth: "tdr" and 11 hex
// digits of sha256(containerID+ifname), within the 15-byte interface name
// limit and the same on every call, so DEL and GC find the device from the
// attachment alone.
func HostVethName(containerID, ifname string) string {
	sum := sha256.Sum256([]byte(containerID + ifname))
	return "tdr" + hex.EncodeToString(sum[:])[:11]
}

// AttachmentID is the agent's cni-attachment-id of one attachment.
func AttachmentID(containerID, ifname string) string {
	return containerID + ":" + ifname
}

// validateIfName rejects names the kernel would refuse, before any change.
func validateIfName(name string) error {
	if name == "" || len(name) > 15 || name == "." || name == ".." || strings.ContainsAny(name, "/: \t\n") {
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("CNI_IFNAME %q is not a valid interface name", name), "")
	}
	return nil
}
