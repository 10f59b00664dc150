package cniserver

import (
	"strings"
	"testing"

	"github.com/tendril-net/tendril/pkg/cni"
)

func TestParseConfig(t *testing.T) {
	cases := []struct {
		name   string
		conf   string
		code   uint // 0: valid
		socket string
		mtu    int
	}{
		{"defaults", `{"cniVersion":"1.1.0","name":"n","type":"tendril-cni"}`, 0, cni.DefaultAgentSocket, 0},
		{"all options", `{"cniVersion":"1.0.0","name":"n","type":"tendril-cni","agent-socket":"unix:///x/y.sock","mtu":1400,"log-file":"/tmp/l"}`, 0, "unix:///x/y.sock", 1400},
		{"not json", `{"cniVersion":`, cni.ErrDecodingFailure, "", 0},
		{"wrong field type", `{"cniVersion":"1.1.0","name":"n","type":"tendril-cni","mtu":"big"}`, cni.ErrDecodingFailure, "", 0},
		{"other plugin type", `{"cniVersion":"1.1.0","name":"n","type":"bridge"}`, cni.ErrInvalidNetworkConfig, "", 0},
		{"no version", `{"name":"n","type":"tendril-cni"}`, cni.ErrInvalidNetworkConfig, "", 0},
		{"unknown version", `{"cniVersion":"9.9.9","name":"n","type":"tendril-cni"}`, cni.ErrIncompatibleCNIVersion, "", 0},
		{"mtu too small", `{"cniVersion":"1.1.0","name":"n","type":"tendril-cni","mtu":500}`, cni.ErrInvalidNetworkConfig, "", 0},
		{"bad prevResult", `{"cniVersion":"1.1.0","name":"n","type":"tendril-cni","prevResult":{"ips":[{"address":"nonsense"}]}}`, cni.ErrDecodingFailure, "", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			conf, err := ParseConfig([]byte(c.conf))
			if c.code != 0 {
				if err == nil {
					t.Fatalf("accepted %s", c.conf)
				}
				if err.Code != c.code {
					t.Fatalf("code %d (%v), want %d", err.Code, err, c.code)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if conf.AgentSocket != c.socket || conf.MTU != c.mtu {
				t.Errorf("socket %q mtu %d, want %q %d", conf.AgentSocket, conf.MTU, c.socket, c.mtu)
			}
		})
	}
}

func TestParseArgs(t *testing.T) {
	a, err := ParseArgs("IgnoreUnknown=1;K8S_POD_NAMESPACE=web;K8S_POD_NAME=front-1;K8S_POD_UID=abc;OTHER=x")
	if err != nil {
		t.Fatal(err)
	}
	if got := a.Owner("cid"); got != "web/front-1" {
		t.Errorf("owner %q, want web/front-1", got)
	}
	if a.K8S_POD_UID != "abc" {
		t.Errorf("uid %q", a.K8S_POD_UID)
	}
	empty, err := ParseArgs("")
	if err != nil {
		t.Fatal(err)
	}
	if got := empty.Owner("cid"); got != "cid" {
		t.Errorf("owner without pod args = %q, want the container ID", got)
	}
	_, err = ParseArgs("K8S_POD_NAME")
	if err == nil {
		t.Fatal("malformed CNI_ARGS accepted")
	}
	if err.Code != cni.ErrInvalidEnvironmentVariables {
		t.Errorf("code %d, want %d", err.Code, cni.ErrInvalidEnvironmentVariables)
	}
}

func TestHostVethName(t *testing.T) {
	a := HostVethName("0123456789abcdef", "eth0")
	if !strings.HasPrefix(a, "tdr") || len(a) != 14 {
		t.Fatalf("name %q: want tdr + 11 hex digits", a)
	}
	// The name must not change between releases: veths of pods created
	// by an earlier agent are found (DEL, GC, restore) by this name.
	if a != "tdr598bbe9b273" {
		t.Errorf("HostVethName changed: %q", a)
	}
	if HostVethName("0123456789abcdef", "eth1") == a || HostVethName("0123456789abcdee", "eth0") == a {
		t.Error("different attachments share a host veth name")
	}
}

func TestValidateIfName(t *testing.T) {
	for _, bad := range []string{"", "a/b", "sixteen-chars-xx", "..", "a b"} {
		if err := validateIfName(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if err := validateIfName("eth0"); err != nil {
		t.Error(err)
	}
}
