package cniserver

import (
	"encoding/json"
	"testing"

	"github.com/tendril-net/tendril/pkg/cni"
)

// FuzzParseConfig: any network configuration either parses into one the
// agent can act on or gets a CNI error with a code of the spec's; what
// parses parses again the same after a round trip through JSON.
func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{
		`{"cniVersion":"1.1.0","name":"n","type":"tendril-cni"}`,
		`{"cniVersion":"1.0.0","name":"n","type":"tendril-cni","agent-socket":"unix:///x/y.sock","mtu":1400,"log-file":"/tmp/l"}`,
		`{"cniVersion":"1.1.0","name":"n","type":"tendril-cni","prevResult":{"cniVersion":"1.1.0","interfaces":[{"name":"eth0","sandbox":"/run/netns/x"}],"ips":[{"address":"10.0.0.2/32","gateway":"10.0.0.1","interface":0}]}}`,
		`{"cniVersion":"1.1.0","name":"n","type":"tendril-cni","cni.dev/valid-attachments":[{"containerID":"c1","ifname":"eth0"}]}`,
		`{"cniVersion":"0.3.1","name":"n","type":"tendril-cni","prevResult":{"ips":[{"version":"4","address":"10.0.0.2/32"}]}}`,
		`{"cniVersion":"1.1.0","name":"n","type":"tendril-cni","mtu":500}`,
		`{"cniVersion":`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		conf, err := ParseConfig(data)
		if err != nil {
			switch err.Code {
			case cni.ErrDecodingFailure, cni.ErrInvalidNetworkConfig, cni.ErrIncompatibleCNIVersion:
			default:
				t.Fatalf("code %d (%v) for a bad configuration", err.Code, err)
			}
			if conf != nil {
				t.Fatal("an error with a configuration")
			}
			return
		}
		if conf.Type != cni.PluginType || conf.AgentSocket == "" || (conf.MTU != 0 && (conf.MTU < 1280 || conf.MTU > 65535)) {
			t.Fatalf("accepted %+v", conf)
		}
		// GC's check of the list never panics on what ParseConfig took.
		_ = requireValidAttachments(data)
		again, merr := json.Marshal(conf)
		if merr != nil {
			t.Fatalf("accepted configuration does not encode: %v", merr)
		}
		if _, err := ParseConfig(again); err != nil {
			t.Fatalf("accepted configuration %s refused after a round trip: %v", again, err)
		}
	})
}

// FuzzParseArgs: CNI_ARGS parse or get code 4; the owner of what parses is
// never empty for a container.
func FuzzParseArgs(f *testing.F) {
	for _, s := range []string{
		"", "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=1234",
		"K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p", "FOO=bar", "K8S_POD_NAME", "a=b=c;;", "IgnoreUnknown=maybe",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, args string) {
		a, err := ParseArgs(args)
		if err != nil {
			if err.Code != cni.ErrInvalidEnvironmentVariables {
				t.Fatalf("code %d for bad CNI_ARGS", err.Code)
			}
			return
		}
		if a.Owner("cid") == "" {
			t.Fatalf("empty owner for %q", args)
		}
	})
}
