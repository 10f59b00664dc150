package cli

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tendril-net/tendril/pkg/hubble"
	"github.com/tendril-net/tendril/pkg/hubble/hubbletest"
	"github.com/tendril-net/tendril/pkg/hubble/hubbletls"
	"github.com/tendril-net/tendril/pkg/hubble/relay"
	"github.com/tendril-net/tendril/pkg/hubble/relay/pool"
	"github.com/tendril-net/tendril/pkg/observer"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// TestObserveRelayOverMutualTLS runs `tendril observe` against a real relay
// (pkg/hubble/relay's server and node pool over a node's Hubble server)
// whose TCP listener serves TLS and requires a client certificate, with a
// CA and certificates made here, as the chart's relay and UI use them: with
// the CA, a client certificate and the relay's name it reads the flows;
// without a certificate, with one of another CA, expecting another name,
// or in plain text it gets none and says why; settings that cannot work
// are refused before connecting.
func TestObserveRelayOverMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca, err := hubbletls.NewCA(dir, "relay-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other, err := hubbletls.NewCA(dir, "other-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	const relayName = "hubble-relay.kube-system.svc"
	issue := func(ca *hubbletls.CA, name, dnsName string) hubbletls.Pair {
		p, err := ca.Issue(dir, name, time.Hour, dnsName)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	server := issue(ca, "relay", relayName)
	client := issue(ca, "observer", "observe.hubble-relay.tendril.io")
	stranger := issue(other, "stranger", "observe.hubble-relay.tendril.io")

	// A node: its Hubble server announces itself through its Peer service.
	obs := observer.New(observer.Config{}, hubbletest.Node{Name: "node-a"}, nil)
	for i, v := range []flowpb.Verdict{flowpb.Verdict_FORWARDED, flowpb.Verdict_DROPPED} {
		obs.Ring().Write(&flowpb.Flow{
			Time: timestamppb.New(time.Now().Add(time.Duration(i-10) * time.Second)), NodeName: "node-a", Verdict: v,
			Source:      &flowpb.Endpoint{Namespace: "shop", PodName: "client"},
			Destination: &flowpb.Endpoint{Namespace: "shop", PodName: "server"},
			L4:          &flowpb.Layer4{Protocol: &flowpb.Layer4_TCP{TCP: &flowpb.TCP{SourcePort: uint32(40000 + i), DestinationPort: 80}}},
			Type:        flowpb.FlowType_L3_L4,
		})
	}
	sock := filepath.Join(t.TempDir(), "hubble.sock")
	node := hubble.New(hubble.Config{SocketPath: sock, TCPAddress: "127.0.0.1:0", Version: "test"}, obs, nil)
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(node.Stop)

	// The relay: mTLS on its TCP listener.
	log := slog.New(slog.DiscardHandler)
	p := pool.New(pool.Config{PeerService: "unix://" + sock, RetryMin: 50 * time.Millisecond, RetryMax: 200 * time.Millisecond}, log)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("pool: %v", err)
		}
	})
	serverTLS, err := hubbletls.Server{CertFile: server.CertFile, KeyFile: server.KeyFile, ClientCAFiles: []string{ca.CertFile}}.Config()
	if err != nil {
		t.Fatal(err)
	}
	srv := relay.NewServer(relay.Config{ListenAddress: []string{"127.0.0.1:0"}}, p, "test", serverTLS, log)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	addr := srv.Addrs()[0].String()
	deadline := time.After(30 * time.Second)
	for connected := false; !connected; {
		nodes, changed := p.Nodes()
		connected = len(nodes) == 1 && nodes[0].State == pool.Connected
		if !connected {
			select {
			case <-changed:
			case <-deadline:
				t.Fatalf("the relay's nodes: %+v", nodes)
			}
		}
	}

	observe := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		var out testutil.SyncBuffer
		err := runObserve(ctx, t, &out, append([]string{"--server", addr, "--all"}, args...)...)
		return out.String(), err
	}
	ca1 := "--tls-ca-cert-files=" + ca.CertFile
	name := "--tls-server-name=" + relayName

	t.Run("the right certificates", func(t *testing.T) {
		out, err := observe(ca1, "--tls-client-cert-file", client.CertFile, "--tls-client-key-file", client.KeyFile, name, "-o", "json")
		if err != nil {
			t.Fatalf("observe over mTLS: %v\n%s", err, out)
		}
		flows := parseJSONLines(t, strings.Split(strings.TrimSpace(out), "\n"))
		if len(flows) != 2 || flows[0].GetVerdict() != flowpb.Verdict_FORWARDED || flows[1].GetVerdict() != flowpb.Verdict_DROPPED || flows[1].GetNodeName() != "node-a" {
			t.Fatalf("flows over mTLS:\n%s", out)
		}
	})
	for what, tc := range map[string]struct {
		args []string
		want string
	}{
		// In TLS 1.3 the server refuses the client after its handshake:
		// the error is the alert's or the broken connection's.
		"no client certificate":       {[]string{ca1, name}, "get flows from"},
		"a certificate of another CA": {[]string{ca1, "--tls-client-cert-file", stranger.CertFile, "--tls-client-key-file", stranger.KeyFile, name}, "get flows from"},
		"another server name": {[]string{ca1, "--tls-client-cert-file", client.CertFile, "--tls-client-key-file", client.KeyFile,
			"--tls-server-name=elsewhere.example"}, "elsewhere.example"},
		"the system's roots": {[]string{"--tls", "--tls-client-cert-file", client.CertFile, "--tls-client-key-file", client.KeyFile, name}, "certificate"},
		"plain text":         {nil, "get flows from"},
		// Refused before connecting.
		"a certificate without its key": {[]string{ca1, "--tls-client-cert-file", client.CertFile}, "key"},
		"a CA file that is not one":     {[]string{"--tls-ca-cert-files", client.KeyFile}, client.KeyFile},
	} {
		t.Run(what, func(t *testing.T) {
			out, err := observe(tc.args...)
			if err == nil {
				t.Fatalf("observe read flows:\n%s", out)
			}
			t.Logf("refused: %v", err)
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not mention %q", err, tc.want)
			}
			if strings.Contains(out, "shop/") {
				t.Errorf("flows printed:\n%s", out)
			}
		})
	}
	t.Run("TLS to a unix socket", func(t *testing.T) {
		var out testutil.SyncBuffer
		err := runObserve(context.Background(), t, &out, "--server", "unix://"+sock, "--tls")
		if err == nil || !strings.Contains(err.Error(), "unix socket") {
			t.Fatalf("TLS to a unix socket: %v", err)
		}
	})
}
