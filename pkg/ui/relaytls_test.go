package ui

import (
	"context"
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"github.com/tendril-net/tendril/pkg/hubble"
	"github.com/tendril-net/tendril/pkg/hubble/hubbletls"
)

// readRelay runs a UI server reading relay until the test ends.
func readRelay(t *testing.T, relay string, relayTLS *tls.Config) *Server {
	t.Helper()
	s := New(Config{Relay: relay, RelayTLS: relayTLS}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.ReadRelay(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("read relay: %v", err)
		}
	})
	return s
}

func (s *Server) state() (connected bool, lastErr string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.connected, s.lastErr
}

// TestReadRelayOverMutualTLS: a real Hubble server (package hubble, the
// same gRPC server setup the relay uses) serves TCP with TLS and requires
// a client certificate signed by its CA, all made here. The UI with the
// CA, its certificate and the server's name reads the flows; without a
// client certificate, with one from another CA, in plain text, or
// expecting another server name it gets none and reports why.
func TestReadRelayOverMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca, err := hubbletls.NewCA(dir, "relay-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other, err := hubbletls.NewCA(dir, "other-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	const serverName = "hubble-relay.kube-system.svc"
	server, err := ca.Issue(dir, "relay", time.Hour, serverName)
	if err != nil {
		t.Fatal(err)
	}
	client, err := ca.Issue(dir, "ui", time.Hour, "ui.hubble-relay.tendril.io")
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := other.Issue(dir, "stranger", time.Hour, "ui.hubble-relay.tendril.io")
	if err != nil {
		t.Fatal(err)
	}
	serverTLS, err := hubbletls.Server{CertFile: server.CertFile, KeyFile: server.KeyFile, ClientCAFiles: []string{ca.CertFile}}.Config()
	if err != nil {
		t.Fatal(err)
	}
	demo := newDemoServer(t, func(c *hubble.Config) { c.TCPAddress, c.TLS = "127.0.0.1:0", serverTLS })
	demo.round(t, 0, 40000)
	addr := demo.srv.TCPAddr().String()

	config := func(t *testing.T, r RelayTLS) *tls.Config {
		t.Helper()
		c, err := r.Config(addr)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	t.Run("the right certificates", func(t *testing.T) {
		s := readRelay(t, addr, config(t, RelayTLS{CAFiles: []string{ca.CertFile}, CertFile: client.CertFile, KeyFile: client.KeyFile, ServerName: serverName}))
		eventually(t, "the flows over mTLS", func() bool { return s.Store().Len() == 10 })
		if connected, lastErr := s.state(); !connected || lastErr != "" {
			t.Errorf("connected %v, error %q", connected, lastErr)
		}
	})
	for name, tc := range map[string]struct {
		tls  func(t *testing.T) *tls.Config
		want string
	}{
		"no client certificate": {func(t *testing.T) *tls.Config {
			return config(t, RelayTLS{CAFiles: []string{ca.CertFile}, ServerName: serverName})
		}, ""}, // in TLS 1.3 the server refuses after the client's handshake: the error is the broken connection's, or the alert's
		"a certificate of another CA": {func(t *testing.T) *tls.Config {
			return config(t, RelayTLS{CAFiles: []string{ca.CertFile}, CertFile: stranger.CertFile, KeyFile: stranger.KeyFile, ServerName: serverName})
		}, ""}, // as above
		"another server name": {func(t *testing.T) *tls.Config {
			return config(t, RelayTLS{CAFiles: []string{ca.CertFile}, CertFile: client.CertFile, KeyFile: client.KeyFile, ServerName: "elsewhere.example"})
		}, "elsewhere.example"},
		"the system's roots": {func(t *testing.T) *tls.Config {
			return config(t, RelayTLS{CertFile: client.CertFile, KeyFile: client.KeyFile, ServerName: serverName})
		}, "certificate"},
		"plain text": {func(*testing.T) *tls.Config { return nil }, ""},
	} {
		t.Run(name, func(t *testing.T) {
			s := readRelay(t, addr, tc.tls(t))
			var lastErr string
			eventually(t, "the refusal", func() bool { _, lastErr = s.state(); return lastErr != "" })
			if !strings.Contains(lastErr, tc.want) {
				t.Errorf("error %q does not mention %q", lastErr, tc.want)
			}
			if n := s.Store().Len(); n != 0 {
				t.Errorf("%d flows read", n)
			}
		})
	}
}

// TestRelayTLSConfigChecked: settings that cannot work are refused before
// any connection: TLS to a unix socket (served in plain text), a
// certificate without its key, an unreadable CA file.
func TestRelayTLSConfigChecked(t *testing.T) {
	dir := t.TempDir()
	ca, err := hubbletls.NewCA(dir, "ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := ca.Issue(dir, "ui", time.Hour, "ui")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		relay string
		tls   RelayTLS
		want  string
	}{
		{"unix:///run/relay.sock", RelayTLS{CAFiles: []string{ca.CertFile}}, "unix socket"},
		{"/run/relay.sock", RelayTLS{CAFiles: []string{ca.CertFile}}, "unix socket"},
		{"relay:80", RelayTLS{CertFile: pair.CertFile}, "key"},
		{"relay:80", RelayTLS{CAFiles: []string{dir + "/missing.crt"}}, "missing.crt"},
		{"relay:80", RelayTLS{CAFiles: []string{pair.KeyFile}}, "no PEM certificate"},
	} {
		if _, err := tc.tls.Config(tc.relay); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %+v: error %v, want one about %q", tc.relay, tc.tls, err, tc.want)
		}
	}
	if (RelayTLS{}).Enabled() || !(RelayTLS{ServerName: "relay"}).Enabled() {
		t.Error("Enabled: any setting turns TLS on, none leaves it off")
	}
}
