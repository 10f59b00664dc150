// Package hubbletls builds the TLS configurations of the Hubble API's TCP
// side from PEM files: the agent's server (a certificate, and client CAs
// when clients must present a certificate: mTLS) and the relay's client
// of the nodes (CAs that sign the nodes' certificates, and its own
// certificate when the nodes ask for one).
package hubbletls

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
)

// ServerName is the name a node's Hubble server certificate carries and
// the Peer service announces: <node>.<cluster>.hubble-grpc.tendril.io, so
// one wildcard-free CA can sign every node's certificate and the relay
// checks it is talking to the node the Peer service named.
func ServerName(node, cluster string) string {
	if cluster == "" {
		cluster = "default"
	}
	return strings.NewReplacer(".", "-", "/", "-").Replace(node) + "." + cluster + ".hubble-grpc.tendril.io"
}

// Server is what a TLS server reads.
type Server struct {
	CertFile, KeyFile string
	// ClientCAFiles: when given, clients must present a certificate
	// signed by one of them (mTLS).
	ClientCAFiles []string
	// AllowAnyClient serves clients without a certificate: only with no
	// ClientCAFiles, and only when asked for explicitly, since a TLS
	// server certificate alone would serve everything to anyone who
	// reaches the port.
	AllowAnyClient bool
}

// Config loads the server's certificate and client CAs.
func (s Server) Config() (*tls.Config, error) {
	if s.CertFile == "" || s.KeyFile == "" {
		return nil, errors.New("a TLS server needs both a certificate file and a key file")
	}
	cert, err := tls.LoadX509KeyPair(s.CertFile, s.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("load TLS certificate %s and key %s: %w", s.CertFile, s.KeyFile, err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13}
	switch {
	case len(s.ClientCAFiles) == 0 && !s.AllowAnyClient:
		return nil, errors.New("a TLS server needs client CA files to verify its clients' certificates (or an explicit choice to serve any client)")
	case len(s.ClientCAFiles) > 0 && s.AllowAnyClient:
		return nil, errors.New("client CA files and serving any client contradict: choose one")
	}
	if len(s.ClientCAFiles) > 0 {
		pool, err := LoadCAs(s.ClientCAFiles)
		if err != nil {
			return nil, err
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// Client is what a TLS client reads.
type Client struct {
	// CAFiles sign the servers' certificates; empty: the system's roots.
	CAFiles []string
	// CertFile and KeyFile are the client's certificate, for servers that
	// require one; empty: none.
	CertFile, KeyFile string
}

// Config loads the client's CAs and certificate. The server name is set
// per connection (the Peer service's TLS server name).
func (c Client) Config() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS13}
	if len(c.CAFiles) > 0 {
		pool, err := LoadCAs(c.CAFiles)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	switch {
	case c.CertFile != "" && c.KeyFile != "":
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("load TLS client certificate %s and key %s: %w", c.CertFile, c.KeyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	case c.CertFile != "" || c.KeyFile != "":
		return nil, errors.New("a TLS client certificate needs both a certificate file and a key file")
	}
	return cfg, nil
}

// LoadCAs reads PEM certificates into a pool; a file without one is an
// error (an empty pool would refuse every peer with a confusing message).
func LoadCAs(files []string) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	for _, f := range files {
		pem, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("read CA file: %w", err)
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA file %s holds no PEM certificate", f)
		}
	}
	return pool, nil
}
