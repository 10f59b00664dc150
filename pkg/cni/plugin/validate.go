package plugin

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"unicode"

	"github.com/tendril-net/tendril/pkg/cni"
)

// invocation holds the CNI_* variables of one run.
type invocation struct {
	containerID, netns, ifName, args, path string
}

// envVar is one CNI_* variable: the commands that require it, and whether
// a required value is checked for its form.
type envVar struct {
	name     string
	required []string
	check    func(string) *cni.Error
	dst      func(*invocation) *string
}

// envVars are the variables of the CNI spec (1.1) and the commands that
// need them; every command needs CNI_PATH.
var envVars = []envVar{
	{"CNI_CONTAINERID", []string{cni.CommandAdd, cni.CommandCheck, cni.CommandDel}, checkContainerID, func(i *invocation) *string { return &i.containerID }},
	{"CNI_NETNS", []string{cni.CommandAdd, cni.CommandCheck}, nil, func(i *invocation) *string { return &i.netns }},
	{"CNI_IFNAME", []string{cni.CommandAdd, cni.CommandCheck, cni.CommandDel}, checkIfName, func(i *invocation) *string { return &i.ifName }},
	{"CNI_ARGS", nil, nil, func(i *invocation) *string { return &i.args }},
	{"CNI_PATH", []string{cni.CommandAdd, cni.CommandCheck, cni.CommandDel, cni.CommandGC, cni.CommandStatus}, nil, func(i *invocation) *string { return &i.path }},
}

// readInvocation reads the CNI_* variables: a missing required one, or a
// container ID or interface name of the wrong form, is code 4.
func readInvocation(command string, getenv func(string) string) (invocation, *cni.Error) {
	var inv invocation
	var missing []string
	for _, v := range envVars {
		val := getenv(v.name)
		*v.dst(&inv) = val
		required := slices.Contains(v.required, command)
		switch {
		case val == "" && required:
			missing = append(missing, v.name)
		case val != "" && required && v.check != nil:
			if err := v.check(val); err != nil {
				return inv, err
			}
		}
	}
	if len(missing) > 0 {
		return inv, cni.Errorf(cni.ErrInvalidEnvironmentVariables, "required env variables [%s] missing", strings.Join(missing, ","))
	}
	return inv, nil
}

// validName reports whether s is a valid container ID or network name:
// an ASCII letter or digit, then letters, digits, '_', '.' or '-'.
func validName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || (c != '_' && c != '.' && c != '-')) {
			return false
		}
	}
	return true
}

func checkContainerID(id string) *cni.Error {
	if !validName(id) {
		return cni.NewError(cni.ErrInvalidEnvironmentVariables, "invalid characters in CNI_CONTAINERID", id)
	}
	return nil
}

// checkIfName rejects interface names the kernel would refuse, before
// anything is changed.
func checkIfName(name string) *cni.Error {
	bad := name == "" || len(name) > 15 || name == "." || name == ".." ||
		strings.ContainsFunc(name, func(r rune) bool { return r == '/' || r == ':' || unicode.IsSpace(r) })
	if bad {
		return cni.Errorf(cni.ErrInvalidEnvironmentVariables, "CNI_IFNAME %q is not a valid interface name", name)
	}
	return nil
}

// netConf is the part of the network configuration the plugin reads. The
// agent decodes the whole configuration again (prevResult, valid
// attachments); the plugin checks what it can so a broken configuration
// gets its code even when the agent is down.
type netConf struct {
	CNIVersion  string `json:"cniVersion"`
	Name        string `json:"name"`
	Type        string `json:"type"`
	AgentSocket string `json:"agent-socket"`
	MTU         int    `json:"mtu"`
	LogFile     string `json:"log-file"`
	// ValidAttachments is GC's list, checked only for being there: the
	// agent reads it.
	ValidAttachments json.RawMessage `json:"cni.dev/valid-attachments"`
}

// minVersion is the oldest configuration version that allows a command.
var minVersion = map[string]string{
	cni.CommandCheck:  "0.4.0",
	cni.CommandGC:     "1.1.0",
	cni.CommandStatus: "1.1.0",
}

// checkConfig decodes and checks the configuration: 6 when it is not JSON
// of the right shape, 1 for a cniVersion the plugin does not speak or that
// does not have the command, 7 for wrong values.
func checkConfig(command string, data []byte) (*netConf, *cni.Error) {
	var c netConf
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, cni.NewError(cni.ErrDecodingFailure, "decode network configuration", err.Error())
	}
	if c.Name == "" {
		return &c, cni.Errorf(cni.ErrInvalidNetworkConfig, "network configuration has no name")
	}
	if !validName(c.Name) {
		return &c, cni.NewError(cni.ErrInvalidNetworkConfig, "invalid characters in the network name", c.Name)
	}
	supported := cni.SupportedVersions()
	have := slices.Index(supported, c.CNIVersion)
	if have < 0 {
		return &c, cni.NewError(cni.ErrIncompatibleCNIVersion, "incompatible CNI versions",
			fmt.Sprintf("config is %q, plugin supports %q", c.CNIVersion, supported))
	}
	if min, ok := minVersion[command]; ok && have < slices.Index(supported, min) {
		return &c, cni.Errorf(cni.ErrIncompatibleCNIVersion, "config version %s does not allow %s (needs %s)", c.CNIVersion, command, min)
	}
	if c.Type != cni.PluginType {
		return &c, cni.Errorf(cni.ErrInvalidNetworkConfig, "network configuration type is %q, want %q", c.Type, cni.PluginType)
	}
	if c.MTU != 0 && (c.MTU < 1280 || c.MTU > 65535) {
		return &c, cni.Errorf(cni.ErrInvalidNetworkConfig, "mtu %d: must be between 1280 and 65535", c.MTU)
	}
	if command == cni.CommandGC && (len(c.ValidAttachments) == 0 || string(c.ValidAttachments) == "null") {
		// The spec makes the list GC's input; without it "nothing is
		// valid" and "the runtime sent nothing" look alike, so GC is
		// refused rather than let collect every attachment.
		return &c, cni.Errorf(cni.ErrInvalidNetworkConfig, "GC needs cni.dev/valid-attachments in the network configuration (the spec requires it); without it nothing is collected")
	}
	if c.AgentSocket == "" {
		c.AgentSocket = cni.DefaultAgentSocket
	}
	return &c, nil
}
