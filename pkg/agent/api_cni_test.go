package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/tendril-net/tendril/pkg/cni"
)

// TestCNIAPI covers the answers of POST /v1/cni/{command} that need no
// network namespace of their own (ADD, CHECK and DEL with real veths are in
// test/cni): STATUS, GC, DEL of an attachment that does not exist, and the
// errors, each a CNI error object with the spec's code.
func TestCNIAPI(t *testing.T) {
	a, _ := startAgent(t, map[string]string{"ipv4-range": "10.0.0.0/24", "ipv6-range": "none"})
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", a.socket)
	}}}
	conf := func(version string) json.RawMessage {
		return json.RawMessage(`{"cniVersion":"` + version + `","name":"n","type":"tendril-cni"}`)
	}
	post := func(command string, req any) (int, []byte) {
		t.Helper()
		body, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := hc.Post("http://agent/v1/cni/"+command, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, out
	}
	cases := []struct {
		name    string
		command string
		req     any
		status  int
		code    uint // CNI code of the error body; 0 for success
	}{
		{"status", "status", cni.Request{Config: conf("1.1.0")}, 204, 0},
		{"gc, nothing to collect", "gc", cni.Request{Config: json.RawMessage(`{"cniVersion":"1.1.0","name":"n","type":"tendril-cni","cni.dev/valid-attachments":[]}`)}, 204, 0},
		{"gc without valid attachments", "gc", cni.Request{Config: conf("1.1.0")}, 400, cni.ErrInvalidNetworkConfig},
		{"del of an unknown attachment", "del", cni.Request{ContainerID: "nope", IfName: "eth0", Config: conf("1.0.0")}, 204, 0},
		{"del with malformed CNI_ARGS", "del", cni.Request{ContainerID: "nope", IfName: "eth0", Args: "K8S_POD_NAME", Config: conf("1.0.0")}, 204, 0},
		{"unknown command", "frob", cni.Request{Config: conf("1.1.0")}, 404, 0},
		{"no configuration", "add", cni.Request{ContainerID: "c", IfName: "eth0"}, 400, cni.ErrDecodingFailure},
		{"configuration of another plugin", "status", cni.Request{Config: json.RawMessage(`{"cniVersion":"1.1.0","name":"n","type":"bridge"}`)}, 400, cni.ErrInvalidNetworkConfig},
		{"unknown version", "add", cni.Request{Config: conf("9.9.9")}, 400, cni.ErrIncompatibleCNIVersion},
		{"bad interface name", "add", cni.Request{ContainerID: "c", IfName: "a/b", Config: conf("1.0.0")}, 400, cni.ErrInvalidEnvironmentVariables},
		{"missing netns", "add", cni.Request{ContainerID: "c", IfName: "eth0", Netns: "/run/netns/tdr-none", Config: conf("1.0.0")}, 400, cni.ErrInvalidEnvironmentVariables},
		{"plugin in another network namespace", "add", cni.Request{ContainerID: "c", IfName: "eth0", Netns: "/proc/self/ns/net", PluginNetNS: "1:2", Config: conf("1.0.0")}, 400, cni.ErrInvalidNetworkConfig},
		{"the node's own namespace as CNI_NETNS", "add", cni.Request{ContainerID: "c", IfName: "eth0", Netns: "/proc/self/ns/net", Config: conf("1.0.0")}, 400, cni.ErrInvalidEnvironmentVariables},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, body := post(c.command, c.req)
			if status != c.status {
				t.Fatalf("status %d (%s), want %d", status, body, c.status)
			}
			if c.code == 0 {
				return
			}
			var e cni.Error
			if err := json.Unmarshal(body, &e); err != nil || e.Code != c.code {
				t.Errorf("body %s, want a CNI error with code %d", body, c.code)
			}
		})
	}
}
