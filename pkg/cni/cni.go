// Package cni is the contract between the tendril-cni plugin and the agent:
// the wire format of the agent's CNI endpoint (POST /v1/cni/{command}, a
// Tendril extension of the Cilium v1 API), the CNI error codes both sides
// use and the configuration's defaults.
//
// It imports only the standard library: the plugin binary links it, and a
// node starts one plugin process per pod attachment, 50 at once when 50
// pods are scheduled together, so every package initialiser and every
// megabyte of binary is paid 50 times. The plugin is in package plugin, the
// agent's side (which does the work) in package cniserver.
package cni

// PluginType is the "type" of a network configuration that runs tendril-cni.
const PluginType = "tendril-cni"

// DefaultAgentSocket is the agent's API socket unless the configuration
// names one ("agent-socket").
const DefaultAgentSocket = "/var/run/tendril/tendril.sock"

// ImplementedVersion is the CNI spec version of VERSION's answer and of
// errors printed before the configuration's version is known.
const ImplementedVersion = "1.1.0"

// SupportedVersions are the CNI spec versions tendril-cni speaks, oldest
// first.
func SupportedVersions() []string { return []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"} }

// Commands of the CNI spec that the agent serves. VERSION is answered by
// the plugin itself.
const (
	CommandAdd    = "ADD"
	CommandDel    = "DEL"
	CommandCheck  = "CHECK"
	CommandStatus = "STATUS"
	CommandGC     = "GC"
)

// AttachmentID is the agent's cni-attachment-id of one attachment
// ("container-id:ifname").
func AttachmentID(containerID, ifname string) string {
	return containerID + ":" + ifname
}
