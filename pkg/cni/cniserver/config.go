package cniserver

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/tendril-net/tendril/pkg/cni"
)

// NetConf is tendril-cni's network configuration, as the runtime gave it to
// the plugin.
type NetConf struct {
	types.PluginConf

	// AgentSocket is the agent's API socket ("unix:///path" or a path).
	AgentSocket string `json:"agent-socket,omitempty"`
	// MTU of the pod's interface; 0 takes the agent's device MTU.
	MTU int `json:"mtu,omitempty"`
	// LogFile receives the plugin's log (the runtime keeps only stdout).
	LogFile string `json:"log-file,omitempty"`
}

// ParseConfig decodes and validates a network configuration. The plugin
// has checked the same before sending it; the agent checks again because
// anything can call its API. Errors carry the spec's codes: 6 for
// undecodable JSON or prevResult, 7 for an invalid configuration.
func ParseConfig(data []byte) (*NetConf, *cni.Error) {
	conf := &NetConf{}
	if err := json.Unmarshal(data, conf); err != nil {
		return nil, cni.NewError(cni.ErrDecodingFailure, "decode network configuration", err.Error())
	}
	if conf.Type != cni.PluginType {
		return nil, cni.Errorf(cni.ErrInvalidNetworkConfig, "network configuration type is %q, want %q", conf.Type, cni.PluginType)
	}
	if conf.CNIVersion == "" {
		return nil, cni.Errorf(cni.ErrInvalidNetworkConfig, "network configuration has no cniVersion")
	}
	supported := false
	for _, v := range cni.SupportedVersions() {
		supported = supported || v == conf.CNIVersion
	}
	if !supported {
		return nil, cni.NewError(cni.ErrIncompatibleCNIVersion, "incompatible CNI versions",
			fmt.Sprintf("config is %q, plugin supports %q", conf.CNIVersion, cni.SupportedVersions()))
	}
	if conf.MTU != 0 && (conf.MTU < 1280 || conf.MTU > 65535) {
		return nil, cni.Errorf(cni.ErrInvalidNetworkConfig, "mtu %d: must be between 1280 and 65535", conf.MTU)
	}
	if conf.AgentSocket == "" {
		conf.AgentSocket = cni.DefaultAgentSocket
	}
	if conf.RawPrevResult != nil {
		if err := version.ParsePrevResult(&conf.PluginConf); err != nil {
			return nil, cni.NewError(cni.ErrDecodingFailure, "decode prevResult", err.Error())
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
func ParseArgs(args string) (*PodArgs, *cni.Error) {
	a := &PodArgs{}
	a.IgnoreUnknown = true
	if err := types.LoadArgs(args, a); err != nil {
		return nil, cni.NewError(cni.ErrInvalidEnvironmentVariables, "parse CNI_ARGS", err.Error())
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
// attachment alone (and an agent restarted on a node finds the veths of
// earlier agents).
func HostVethName(containerID, ifname string) string {
	sum := sha256.Sum256([]byte(containerID + ifname))
	return "tdr" + hex.EncodeToString(sum[:])[:11]
}

// validateIfName rejects names the kernel would refuse, before any change.
func validateIfName(name string) *cni.Error {
	if name == "" || len(name) > 15 || name == "." || name == ".." || strings.ContainsAny(name, "/: \t\n") {
		return cni.Errorf(cni.ErrInvalidEnvironmentVariables, "CNI_IFNAME %q is not a valid interface name", name)
	}
	return nil
}
