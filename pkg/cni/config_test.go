package cni

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
)

func cniCode(t *testing.T, err error) uint {
	t.Helper()
	var te *types.Error
	if !errors.As(err, &te) {
		t.Fatalf("error %v (%T) is not a *types.Error", err, err)
	}
	return te.Code
}

func TestParseConfig(t *testing.T) {
	cases := []struct {
		name   string
		conf   string
		code   uint // 0: valid
		socket string
		mtu    int
	}{
		{"defaults", `{"cniVersion":"1.1.0","name":"n","type":"tendril-cni"}`, 0, DefaultAgentSocket, 0},
		{"all options", `{"cniVersion":"1.0.0","name":"n","type":"tendril-cni","agent-socket":"unix:///x/y.sock","mtu":1400,"log-file":"/tmp/l"}`, 0, "unix:///x/y.sock", 1400},
		{"not json", `{"cniVersion":`, types.ErrDecodingFailure, "", 0},
		{"wrong field type", `{"cniVersion":"1.1.0","name":"n","type":"tendril-cni","mtu":"big"}`, types.ErrDecodingFailure, "", 0},
		{"other plugin type", `{"cniVersion":"1.1.0","name":"n","type":"bridge"}`, types.ErrInvalidNetworkConfig, "", 0},
		{"no version", `{"name":"n","type":"tendril-cni"}`, types.ErrInvalidNetworkConfig, "", 0},
		{"mtu too small", `{"cniVersion":"1.1.0","name":"n","type":"tendril-cni","mtu":500}`, types.ErrInvalidNetworkConfig, "", 0},
		{"bad prevResult", `{"cniVersion":"1.1.0","name":"n","type":"tendril-cni","prevResult":{"ips":[{"address":"nonsense"}]}}`, types.ErrDecodingFailure, "", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			conf, err := ParseConfig([]byte(c.conf))
			if c.code != 0 {
				if err == nil {
					t.Fatalf("accepted %s", c.conf)
				}
				if got := cniCode(t, err); got != c.code {
					t.Fatalf("code %d (%v), want %d", got, err, c.code)
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
	if got := cniCode(t, err); got != types.ErrInvalidEnvironmentVariables {
		t.Errorf("code %d, want %d", got, types.ErrInvalidEnvironmentVariables)
	}
}

func TestHostVethName(t *testing.T) {
	a := HostVethName("0123456789abcdef", "eth0")
	if len(a) > 15 || !strings.HasPrefix(a, "tdr") || len(a) != 14 {
		t.Fatalf("name %q: want tdr + 11 hex digits", a)
	}
	if HostVethName("0123456789abcdef", "eth0") != a {
		t.Error("name is not stable")
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

func TestParseIPAM(t *testing.T) {
	// The agent's answer as the Cilium models encode it, read through the
	// plugin's own wire structs.
	ok := wireRoundTrip[ipamResponse](t, &models.IPAMResponse{
		Address:        &models.AddressPair{IPV4: "10.1.0.7", IPV6: "fd00::7", IPV4ExpirationUUID: "u4"},
		HostAddressing: &models.NodeAddressing{IPV4: &models.NodeAddressingElement{Enabled: true, IP: "10.1.0.1"}, IPV6: &models.NodeAddressingElement{Enabled: true, IP: "fd00::1"}},
		IPV6:           &models.IPAMAddressResponse{IP: "fd00::7", ExpirationUUID: "u6"},
	})
	a, err := parseIPAM(ok)
	if err != nil {
		t.Fatal(err)
	}
	if a.v4.String() != "10.1.0.7" || a.router4.String() != "10.1.0.1" || a.v6.String() != "fd00::7" || a.router6.String() != "fd00::1" {
		t.Errorf("parsed %+v", a)
	}
	if a.expire4 != "u4" || a.expire6 != "u6" {
		t.Errorf("expiration UUIDs %q %q, want u4 u6", a.expire4, a.expire6)
	}
	// Gateway of the family answer when host-addressing has no IP.
	gw := &ipamResponse{Address: &addressPair{IPV4: "10.1.0.8"}, IPV4: &ipamAddressResponse{Gateway: "10.1.0.1"}}
	if a, err := parseIPAM(gw); err != nil || a.router4.String() != "10.1.0.1" {
		t.Errorf("gateway fallback: %v %v", a, err)
	}
	// A broken answer still reports what was allocated, so it is released.
	noRouter := &ipamResponse{Address: &addressPair{IPV4: "10.1.0.9"}}
	a, err = parseIPAM(noRouter)
	if err == nil {
		t.Fatal("answer without a router address accepted")
	}
	if len(a.allocated) != 1 || a.allocated[0].String() != "10.1.0.9" {
		t.Errorf("allocated %v, want [10.1.0.9] for rollback", a.allocated)
	}
	for _, bad := range []*ipamResponse{nil, {}, {Address: &addressPair{}}, {Address: &addressPair{IPV4: "fd00::1"}}} {
		if _, err := parseIPAM(bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

func TestCNIErrorCodes(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "unix", Err: syscall.ECONNREFUSED}
	cases := []struct {
		err  error
		want uint
	}{
		{fmt.Errorf("wrapped: %w", refused), types.ErrTryAgainLater},
		{&APIError{Code: http.StatusServiceUnavailable}, types.ErrTryAgainLater},
		{&APIError{Code: http.StatusInternalServerError, Message: "pool exhausted"}, ErrAllocation},
		{types.NewError(types.ErrInvalidEnvironmentVariables, "x", ""), types.ErrInvalidEnvironmentVariables},
	}
	for _, c := range cases {
		if got := cniError(ErrAllocation, "msg", c.err).Code; got != c.want {
			t.Errorf("%v: code %d, want %d", c.err, got, c.want)
		}
	}
}

// fakeAgent serves canned answers on a unix socket; unit tests only (the
// plugin's real tests run against the real agent in test/cni).
func fakeAgent(t *testing.T, handler http.Handler) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "fake.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: handler}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
	return sock
}

func TestStatus(t *testing.T) {
	withRange := &models.DaemonConfiguration{Status: &models.DaemonConfigurationStatus{Addressing: &models.NodeAddressing{
		IPV4: &models.NodeAddressingElement{Enabled: true, IP: "10.1.0.1", AllocRange: "10.1.0.0/24"}}}}
	noRange := &models.DaemonConfiguration{Status: &models.DaemonConfigurationStatus{Addressing: &models.NodeAddressing{
		IPV4: &models.NodeAddressingElement{Enabled: true}}}}
	serve := func(cfg *models.DaemonConfiguration) string {
		return fakeAgent(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/v1/config" {
				http.NotFound(w, r)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(cfg)
		}))
	}
	cases := []struct {
		name   string
		socket string
		want   uint
	}{
		{"ready", serve(withRange), 0},
		{"no pool yet", serve(noRange), ErrPluginNotAvailable},
		{"no agent", filepath.Join(t.TempDir(), "none.sock"), ErrPluginNotAvailable},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"n","type":"tendril-cni","agent-socket":%q}`, c.socket)
			p := New(Config{Timeout: DefaultConfig().Timeout, Stdout: os.Stdout}, nil)
			err := p.Status(&skel.CmdArgs{StdinData: []byte(conf)})
			if c.want == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatal("STATUS succeeded")
			}
			if got := cniCode(t, err); got != c.want {
				t.Errorf("code %d (%v), want %d", got, err, c.want)
			}
		})
	}
}

func TestEndpointAttachment(t *testing.T) {
	ep := wireRoundTrip[endpoint](t, &models.Endpoint{ID: 7, Status: &models.EndpointStatus{
		ExternalIdentifiers: &models.EndpointIdentifiers{ContainerID: "c1"},
		Networking:          &models.EndpointNetworking{ContainerInterfaceName: "eth0"},
	}})
	if cid, ifn := endpointAttachment(ep); cid != "c1" || ifn != "eth0" || ep.ID != 7 {
		t.Errorf("got %q %q %d", cid, ifn, ep.ID)
	}
	if cid, _ := endpointAttachment(wireRoundTrip[endpoint](t, &models.Endpoint{ID: 1, Status: &models.EndpointStatus{}})); cid != "" {
		t.Errorf("host endpoint reported container %q", cid)
	}
}

// wireRoundTrip encodes a Cilium model and decodes it into the plugin's wire
// struct W: the field names must agree.
func wireRoundTrip[W any](t *testing.T, model any) *W {
	t.Helper()
	b, err := json.Marshal(model)
	if err != nil {
		t.Fatal(err)
	}
	var w W
	if err := json.Unmarshal(b, &w); err != nil {
		t.Fatal(err)
	}
	return &w
}

// TestWireFormat checks the plugin's requests decode into the Cilium models
// with every field intact, and the config and health answers the other way.
func TestWireFormat(t *testing.T) {
	req := &endpointChangeRequest{
		Addressing:  &addressPair{IPV4: "10.0.0.2", IPV4ExpirationUUID: "u4", IPV6: "fd00::2", IPV6ExpirationUUID: "u6"},
		ContainerID: "cid", ContainerInterfaceName: "eth0", InterfaceName: "tdrx", InterfaceIndex: 9,
		HostMac: "aa:bb:cc:dd:ee:ff", Mac: "11:22:33:44:55:66", K8sNamespace: "ns", K8sPodName: "p", K8sUID: "uid",
		Properties: map[string]any{"netns-path": "/run/netns/x"}, State: "waiting-for-identity", SyncBuildEndpoint: true,
		DatapathConfiguration: &endpointDatapathConfiguration{InstallEndpointRoute: true},
	}
	m := wireRoundTrip[models.EndpointChangeRequest](t, req)
	back := wireRoundTrip[endpointChangeRequest](t, m)
	a, _ := json.Marshal(req)
	b, _ := json.Marshal(back)
	if string(a) != string(b) {
		t.Errorf("endpoint change request lost fields through the model:\n plugin %s\n model  %s", a, b)
	}
	if m.State == nil || *m.State != models.EndpointStateWaitingDashForDashIdentity || !m.SyncBuildEndpoint || m.Addressing.IPV4ExpirationUUID != "u4" {
		t.Errorf("model read %+v", m)
	}

	cfg := wireRoundTrip[daemonConfiguration](t, &models.DaemonConfiguration{Status: &models.DaemonConfigurationStatus{
		DeviceMTU: 1450, Addressing: &models.NodeAddressing{IPV4: &models.NodeAddressingElement{Enabled: true, IP: "10.0.0.1", AllocRange: "10.0.0.0/24"}}}})
	if cfg.Status == nil || cfg.Status.DeviceMTU != 1450 || cfg.Status.Addressing.IPV4.AllocRange != "10.0.0.0/24" {
		t.Errorf("config read %+v", cfg.Status)
	}
	h := wireRoundTrip[endpointHealth](t, &models.EndpointHealth{OverallHealth: models.EndpointHealthStatusFailure, Bpf: models.EndpointHealthStatusOK})
	if h.OverallHealth != "Failure" || h.Bpf != "OK" {
		t.Errorf("health read %+v", h)
	}
}
