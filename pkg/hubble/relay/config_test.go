package relay

import (
	"strings"
	"testing"
)

// TestConfigRequiresClientCertificates: the relay presents a client
// certificate to the nodes unless told they serve plain text, and its own
// TLS listener requires one from its clients unless told otherwise.
func TestConfigRequiresClientCertificates(t *testing.T) {
	base := func() Config {
		c := DefaultConfig
		c.PeerService = "unix:///run/tendril/hubble.sock"
		c.TLSHubbleServerCAFiles = []string{"/ca.crt"}
		c.TLSClientCertFile, c.TLSClientKeyFile = "/relay.crt", "/relay.key"
		return c
	}
	if err := base().Validate(); err != nil {
		t.Fatalf("relay with a client certificate: %v", err)
	}
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"no client certificate", func(c *Config) { c.TLSClientCertFile, c.TLSClientKeyFile = "", "" }, "--tls-client-cert-file"},
		{"server TLS without client CAs", func(c *Config) {
			c.TLSRelayServerCertFile, c.TLSRelayServerKeyFile = "/s.crt", "/s.key"
		}, "--tls-relay-client-ca-files"},
		{"client CAs and any client", func(c *Config) {
			c.TLSRelayServerCertFile, c.TLSRelayServerKeyFile = "/s.crt", "/s.key"
			c.TLSRelayClientCAFiles, c.TLSRelayDisableClientAuth = []string{"/ca.crt"}, true
		}, "choose one"},
	} {
		c := base()
		tc.mutate(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %s", tc.name, err, tc.want)
		}
	}
	plain := base()
	plain.TLSHubbleServerCAFiles, plain.TLSClientCertFile, plain.TLSClientKeyFile, plain.DisableClientTLS = nil, "", "", true
	if err := plain.Validate(); err != nil {
		t.Errorf("plain text to the nodes: %v", err)
	}
	anyClient := base()
	anyClient.TLSRelayServerCertFile, anyClient.TLSRelayServerKeyFile, anyClient.TLSRelayDisableClientAuth = "/s.crt", "/s.key", true
	if err := anyClient.Validate(); err != nil {
		t.Errorf("server TLS serving any client, asked for: %v", err)
	}
}
