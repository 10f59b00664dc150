package ui

import (
	"crypto/tls"
	"fmt"
	"strings"

	"github.com/tendril-net/tendril/pkg/hubble/hubbletls"
)

// RelayTLS is how the UI reaches a relay that serves TLS (the relay's
// --tls-relay-server-cert-file), as hubble-ui reaches hubble-relay: the CAs
// that sign the relay's certificate, the UI's own certificate when the relay
// requires one (its --tls-relay-client-ca-files: mTLS), and the name the
// relay's certificate must carry.
type RelayTLS struct {
	// CAFiles sign the relay's certificate; empty: the system's roots.
	CAFiles []string
	// CertFile and KeyFile are the UI's client certificate; empty: none
	// (only for a relay run with --tls-relay-disable-client-auth).
	CertFile, KeyFile string
	// ServerName is the name checked on the relay's certificate; empty:
	// the relay address's host.
	ServerName string
}

// Enabled reports whether any TLS setting is given: any of them turns TLS
// on, so a CA file alone is enough against a relay that asks for no
// client certificate.
func (r RelayTLS) Enabled() bool {
	return len(r.CAFiles) > 0 || r.CertFile != "" || r.KeyFile != "" || r.ServerName != ""
}

// Config checks the settings against the relay's address and loads the
// files. A unix socket is refused: the relay serves it in plain text
// (file permissions guard it), so TLS there would only fail later, on
// every connection attempt.
func (r RelayTLS) Config(relay string) (*tls.Config, error) {
	if strings.HasPrefix(relay, "unix://") || strings.HasPrefix(relay, "/") {
		return nil, fmt.Errorf("%s is a unix socket, which the relay and the agents serve without TLS", relay)
	}
	cfg, err := hubbletls.Client{CAFiles: r.CAFiles, CertFile: r.CertFile, KeyFile: r.KeyFile}.Config()
	if err != nil {
		return nil, err
	}
	cfg.ServerName = r.ServerName
	return cfg, nil
}
