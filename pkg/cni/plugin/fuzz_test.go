package plugin

import (
	"testing"

	"github.com/tendril-net/tendril/pkg/cni"
)

// FuzzInvocation: the plugin's checks of the CNI_* variables and of the
// configuration never panic, answer only the spec's codes, and what they
// accept has a valid name, a known version that allows the command, the
// plugin's type and an absolute agent socket or a clear error for it.
func FuzzInvocation(f *testing.F) {
	conf := `{"cniVersion":"1.1.0","name":"net","type":"tendril-cni","agent-socket":"unix:///run/t.sock"}`
	f.Add("ADD", "c1", "/run/netns/x", "eth0", "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p", "/opt/cni/bin", []byte(conf))
	f.Add("DEL", "c1", "", "eth0", "", "/opt/cni/bin", []byte(`{"cniVersion":"0.3.1","name":"n","type":"tendril-cni"}`))
	f.Add("CHECK", "-x/y", "/run/netns/x", "a/b", "", "/opt/cni/bin", []byte(`{"cniVersion":"0.4.0","name":"n","type":"tendril-cni","mtu":1400}`))
	f.Add("GC", "", "", "", "", "/opt/cni/bin", []byte(`{"cniVersion":"1.1.0","name":"n","type":"tendril-cni","cni.dev/valid-attachments":[]}`))
	f.Add("STATUS", "", "", "", "", "/opt/cni/bin", []byte(`{"cniVersion":"1.1.0","name":"n","type":"tendril-cni","agent-socket":"x.sock"}`))
	f.Fuzz(func(t *testing.T, command, containerID, netns, ifname, args, path string, stdin []byte) {
		env := map[string]string{"CNI_CONTAINERID": containerID, "CNI_NETNS": netns, "CNI_IFNAME": ifname, "CNI_ARGS": args, "CNI_PATH": path}
		inv, err := readInvocation(command, func(k string) string { return env[k] })
		if err != nil {
			if err.Code != cni.ErrInvalidEnvironmentVariables {
				t.Fatalf("code %d for bad CNI_* variables", err.Code)
			}
		} else if command == cni.CommandAdd && (checkContainerID(inv.containerID) != nil || checkIfName(inv.ifName) != nil) {
			t.Fatalf("ADD accepted with container %q ifname %q", inv.containerID, inv.ifName)
		}
		c, cerr := checkConfig(command, stdin)
		if cerr != nil {
			switch cerr.Code {
			case cni.ErrDecodingFailure, cni.ErrInvalidNetworkConfig, cni.ErrIncompatibleCNIVersion:
			default:
				t.Fatalf("code %d for a bad configuration", cerr.Code)
			}
			return
		}
		if !validName(c.Name) || c.Type != cni.PluginType || c.AgentSocket == "" {
			t.Fatalf("accepted %+v", c)
		}
		if command == cni.CommandGC && (len(c.ValidAttachments) == 0 || string(c.ValidAttachments) == "null") {
			t.Fatalf("GC accepted without cni.dev/valid-attachments: %s", stdin)
		}
		if p, err := socketPath(c.AgentSocket); err == nil && (p == "" || p[0] != '/') {
			t.Fatalf("socket %q taken as %q", c.AgentSocket, p)
		}
	})
}
