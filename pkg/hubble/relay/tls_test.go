package relay

import (
	"context"
	"crypto/tls"
	"path/filepath"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tendril-net/tendril/pkg/hubble"
	"github.com/tendril-net/tendril/pkg/hubble/hubbletls"
	"github.com/tendril-net/tendril/pkg/hubble/relay/pool"
)

// TestRelayMutualTLS: nodes serve TCP with TLS and require a client
// certificate (mTLS), with certificates made here (crypto/x509): the
// relay with its client certificate reaches both nodes by their announced
// server names; a client without a certificate, a plain-text client and a
// relay without a certificate are refused.
func TestRelayMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca, err := hubbletls.NewCA(dir, "hubble-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	a, b, _ := twoNodes(t, func(name string, c *hubble.Config) {
		sn := hubbletls.ServerName(name, "default")
		pair, err := ca.Issue(dir, name, time.Hour, sn)
		if err != nil {
			t.Fatal(err)
		}
		c.TLS, err = hubbletls.Server{CertFile: pair.CertFile, KeyFile: pair.KeyFile, ClientCAFiles: []string{ca.CertFile}}.Config()
		if err != nil {
			t.Fatal(err)
		}
		c.TLSServerName = sn
	})
	a.flow(1, "shop", flowpb.Verdict_FORWARDED)
	b.flow(2, "data", flowpb.Verdict_DROPPED)

	relayPair, err := ca.Issue(dir, "relay", time.Hour, "relay.hubble-relay.tendril.io")
	if err != nil {
		t.Fatal(err)
	}
	clientTLS, err := hubbletls.Client{CAFiles: []string{ca.CertFile}, CertFile: relayPair.CertFile, KeyFile: relayPair.KeyFile}.Config()
	if err != nil {
		t.Fatal(err)
	}
	c, p := startRelay(t, "unix://"+a.sock, pool.Config{NodeTLS: clientTLS})
	waitConnected(t, p, "node-a", "node-b")
	if got, nodes := times(collect(t, c, &observerpb.GetFlowsRequest{})); len(got) != 2 || nodes[0] != "node-a" || nodes[1] != "node-b" {
		t.Fatalf("flows over mTLS: %v of %v", got, nodes)
	}
	gn, err := c.GetNodes(context.Background(), &observerpb.GetNodesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range gn.GetNodes() {
		if !n.GetTls().GetEnabled() || n.GetTls().GetServerName() != hubbletls.ServerName(n.GetName(), "default") {
			t.Errorf("node %s TLS %v", n.GetName(), n.GetTls())
		}
	}

	// Direct clients of node-a's TCP listener.
	noCert, err := hubbletls.Client{CAFiles: []string{ca.CertFile}}.Config()
	if err != nil {
		t.Fatal(err)
	}
	noCert.ServerName = hubbletls.ServerName("node-a", "default")
	for name, creds := range map[string]credentials.TransportCredentials{
		"TLS without a client certificate": credentials.NewTLS(noCert),
		"plain text":                       insecure.NewCredentials(),
	} {
		t.Run(name, func(t *testing.T) {
			conn, err := grpc.NewClient(a.addr, grpc.WithTransportCredentials(creds))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if st, err := observerpb.NewObserverClient(conn).ServerStatus(ctx, &observerpb.ServerStatusRequest{}); err == nil {
				t.Fatalf("refused client answered: %v", st)
			} else {
				t.Logf("refused: %v", err)
			}
		})
	}
	// The control: the same client with the relay's certificate is served.
	withCert := clientTLS.Clone()
	withCert.ServerName = hubbletls.ServerName("node-a", "default")
	conn, err := grpc.NewClient(a.addr, grpc.WithTransportCredentials(credentials.NewTLS(withCert)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := observerpb.NewObserverClient(conn).ServerStatus(ctx, &observerpb.ServerStatusRequest{}); err != nil {
		t.Fatalf("client with a certificate refused: %v", err)
	}

	t.Run("relay without a client certificate", func(t *testing.T) {
		c, p := startRelay(t, "unix://"+a.sock, pool.Config{NodeTLS: noCertNoName(t, ca)})
		waitState(t, p, pool.Unavailable)
		st, err := c.ServerStatus(context.Background(), &observerpb.ServerStatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if st.GetNumConnectedNodes().GetValue() != 0 || st.GetNumUnavailableNodes().GetValue() != 2 {
			t.Fatalf("status %v", st)
		}
	})
}

func noCertNoName(t *testing.T, ca *hubbletls.CA) *tls.Config {
	t.Helper()
	c, err := hubbletls.Client{CAFiles: []string{ca.CertFile}}.Config()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// waitState waits until every node of the pool is in state s.
func waitState(t *testing.T, p *pool.Pool, s pool.State) {
	t.Helper()
	deadline := time.After(15 * time.Second)
	for {
		nodes, changed := p.Nodes()
		all := len(nodes) > 0
		for _, n := range nodes {
			all = all && n.State == s
		}
		if all {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("nodes %+v, want all %s", nodes, s)
		}
	}
}

// TestRelayServerMutualTLS: the relay's TCP listener serves TLS and
// requires a client certificate; its unix socket stays plain text.
func TestRelayServerMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca, err := hubbletls.NewCA(dir, "relay-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	const name = "relay.hubble-relay.tendril.io"
	serverPair, err := ca.Issue(dir, "relay-server", time.Hour, name)
	if err != nil {
		t.Fatal(err)
	}
	clientPair, err := ca.Issue(dir, "client", time.Hour, "client.hubble-relay.tendril.io")
	if err != nil {
		t.Fatal(err)
	}
	serverTLS, err := hubbletls.Server{CertFile: serverPair.CertFile, KeyFile: serverPair.KeyFile, ClientCAFiles: []string{ca.CertFile}}.Config()
	if err != nil {
		t.Fatal(err)
	}
	a, _, _ := twoNodes(t, nil)
	_, p := startRelay(t, "unix://"+a.sock, pool.Config{})
	waitConnected(t, p, "node-a", "node-b")
	sock := filepath.Join(t.TempDir(), "relay-tls.sock")
	srv := NewServer(Config{ListenAddress: []string{"127.0.0.1:0", "unix://" + sock}}, p, "relay-test", serverTLS, nil)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	tcp := srv.Addrs()[0].String()

	status := func(target string, creds credentials.TransportCredentials) error {
		conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(creds))
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st, err := observerpb.NewObserverClient(conn).ServerStatus(ctx, &observerpb.ServerStatusRequest{})
		if err == nil && st.GetNumConnectedNodes().GetValue() != 2 {
			t.Errorf("status over %s: %v", target, st)
		}
		return err
	}
	withCert, err := hubbletls.Client{CAFiles: []string{ca.CertFile}, CertFile: clientPair.CertFile, KeyFile: clientPair.KeyFile}.Config()
	if err != nil {
		t.Fatal(err)
	}
	withCert.ServerName = name
	if err := status(tcp, credentials.NewTLS(withCert)); err != nil {
		t.Fatalf("client with a certificate: %v", err)
	}
	noCert := noCertNoName(t, ca)
	noCert.ServerName = name
	if err := status(tcp, credentials.NewTLS(noCert)); err == nil {
		t.Fatal("client without a certificate served")
	}
	if err := status(tcp, insecure.NewCredentials()); err == nil {
		t.Fatal("plain-text client served over TCP")
	}
	if err := status("unix://"+sock, insecure.NewCredentials()); err != nil {
		t.Fatalf("unix socket: %v", err)
	}
}
