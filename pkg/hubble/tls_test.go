package hubble

import (
	"context"
	"crypto/tls"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	observerpb "github.com/cilium/cilium/api/v1/observer"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/tendril-net/tendril/pkg/hubble/hubbletest"
	"github.com/tendril-net/tendril/pkg/hubble/hubbletls"
	"github.com/tendril-net/tendril/pkg/observer"
)

// pki is a CA with a server certificate for node-a, a client certificate
// from the same CA, and a client certificate from another CA.
type pki struct {
	ca                          *hubbletls.CA
	server, client, otherClient hubbletls.Pair
}

func newPKI(t *testing.T) pki {
	t.Helper()
	dir := t.TempDir()
	ca, err := hubbletls.NewCA(dir, "hubble-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other, err := hubbletls.NewCA(dir, "other-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p := pki{ca: ca}
	if p.server, err = ca.Issue(dir, "node-a", time.Hour, hubbletls.ServerName("node-a", "default")); err != nil {
		t.Fatal(err)
	}
	if p.client, err = ca.Issue(dir, "relay", time.Hour, "relay.hubble-relay.tendril.io"); err != nil {
		t.Fatal(err)
	}
	if p.otherClient, err = other.Issue(dir, "stranger", time.Hour, "relay.hubble-relay.tendril.io"); err != nil {
		t.Fatal(err)
	}
	return p
}

// startTLSServer serves node-a's observer on a unix socket and a TCP port
// with mTLS (client CA: p.ca) and the given limits.
func startTLSServer(t *testing.T, p pki, mutate func(*Config)) *Server {
	t.Helper()
	tlsCfg, err := hubbletls.Server{CertFile: p.server.CertFile, KeyFile: p.server.KeyFile, ClientCAFiles: []string{p.ca.CertFile}}.Config()
	if err != nil {
		t.Fatal(err)
	}
	obs := observer.New(observer.Config{}, hubbletest.Node{Name: "node-a"}, nil)
	cfg := Config{SocketPath: filepath.Join(t.TempDir(), "hubble.sock"), TCPAddress: "127.0.0.1:0", TLS: tlsCfg, Version: "tendril-test"}
	if mutate != nil {
		mutate(&cfg)
	}
	srv := New(cfg, obs, nil)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	return srv
}

// clientTLS is a client's TLS towards node-a: it trusts p.ca and presents
// pair's certificate (none when pair is empty).
func clientTLS(t *testing.T, p pki, pair hubbletls.Pair) *tls.Config {
	t.Helper()
	c, err := hubbletls.Client{CAFiles: []string{p.ca.CertFile}, CertFile: pair.CertFile, KeyFile: pair.KeyFile}.Config()
	if err != nil {
		t.Fatal(err)
	}
	c.ServerName = hubbletls.ServerName("node-a", "default")
	return c
}

// serverStatus calls ServerStatus over a new connection; conn is left open for
// the caller to close.
func serverStatus(t *testing.T, addr string, c *tls.Config) (*grpc.ClientConn, error) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(c)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = observerpb.NewObserverClient(conn).ServerStatus(ctx, &observerpb.ServerStatusRequest{})
	return conn, err
}

// TestServerTLSWithoutClientCAIsRefused: a TLS server configuration with a
// certificate but no client CA would serve every flow of the node to any
// TLS client; it is an error unless AllowAnyClient says so.
func TestServerTLSWithoutClientCAIsRefused(t *testing.T) {
	p := newPKI(t)
	_, err := hubbletls.Server{CertFile: p.server.CertFile, KeyFile: p.server.KeyFile}.Config()
	if err == nil || !strings.Contains(err.Error(), "client CA") {
		t.Fatalf("TLS server without client CAs: %v, want an error naming the client CAs", err)
	}
	cfg, err := hubbletls.Server{CertFile: p.server.CertFile, KeyFile: p.server.KeyFile, AllowAnyClient: true}.Config()
	if err != nil || cfg.ClientAuth != tls.NoClientCert {
		t.Fatalf("AllowAnyClient: %v, client auth %v", err, cfg)
	}
	if _, err := (hubbletls.Server{CertFile: p.server.CertFile, KeyFile: p.server.KeyFile, ClientCAFiles: []string{p.ca.CertFile}, AllowAnyClient: true}).Config(); err == nil {
		t.Fatal("client CAs with AllowAnyClient accepted: the two contradict")
	}
}

// TestTCPListenerVerifiesClientCertificates: over mTLS a client without a
// certificate and one with a certificate of another CA are refused; one
// with a certificate of the client CA is served.
func TestTCPListenerVerifiesClientCertificates(t *testing.T) {
	p := newPKI(t)
	addr := startTLSServer(t, p, nil).TCPAddr().String()
	for name, pair := range map[string]hubbletls.Pair{"no certificate": {}, "certificate of another CA": p.otherClient} {
		conn, err := serverStatus(t, addr, clientTLS(t, p, pair))
		conn.Close()
		if err == nil {
			t.Errorf("client with %s was served", name)
		}
	}
	conn, err := serverStatus(t, addr, clientTLS(t, p, p.client))
	conn.Close()
	if err != nil {
		t.Fatalf("client with a certificate of the client CA refused: %v", err)
	}
}

// TestTCPConnectionLimit: with MaxConnections 1, a second connection is
// closed at once while the first is open, and a new one is served once
// the first is gone.
func TestTCPConnectionLimit(t *testing.T) {
	p := newPKI(t)
	addr := startTLSServer(t, p, func(c *Config) { c.MaxConnections = 1 }).TCPAddr().String()
	first, err := serverStatus(t, addr, clientTLS(t, p, p.client))
	if err != nil {
		t.Fatalf("first connection: %v", err)
	}
	second, err := serverStatus(t, addr, clientTLS(t, p, p.client))
	second.Close()
	if err == nil {
		t.Fatal("a second connection was served past MaxConnections 1")
	}
	first.Close()
	// The server sees the first connection end eventually: poll.
	deadline := time.Now().Add(30 * time.Second)
	for {
		third, err := serverStatus(t, addr, clientTLS(t, p, p.client))
		third.Close()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no connection served after the first closed: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestTCPStreamLimitIsAnnounced: the server announces MaxConcurrentStreams
// in its HTTP/2 SETTINGS (which clients obey and the server enforces by
// refusing streams past it).
func TestTCPStreamLimitIsAnnounced(t *testing.T) {
	p := newPKI(t)
	addr := startTLSServer(t, p, func(c *Config) { c.MaxConcurrentStreams = 3 }).TCPAddr().String()
	c := clientTLS(t, p, p.client)
	c.NextProtos = []string{"h2"}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, c)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(conn, conn)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		sf, ok := f.(*http2.SettingsFrame)
		if !ok || sf.IsAck() {
			continue
		}
		v, ok := sf.Value(http2.SettingMaxConcurrentStreams)
		if !ok || v != 3 {
			t.Fatalf("SETTINGS_MAX_CONCURRENT_STREAMS = %d (announced %v), want 3", v, ok)
		}
		return
	}
}
