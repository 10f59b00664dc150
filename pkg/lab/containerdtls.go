package lab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tendril-net/tendril/pkg/hubble/hubbletls"
)

// Secrets of the chart's Hubble TLS values (its defaults), which a
// containerd lab creates before helm install: the chart makes no keys.
const (
	hubbleServerSecret      = "hubble-server-certs"
	hubbleRelayClientSecret = "hubble-relay-client-certs"
	hubbleRelayServerSecret = "hubble-relay-server-certs"
)

// HubbleTLSDir holds a containerd lab's Hubble PKI: the CA (hubble-ca.crt)
// and each certificate the Secrets carry, plus client.crt/client.key, the
// certificate a user's hubble or tendril observe presents to the relay.
func (s *State) HubbleTLSDir() string { return filepath.Join(s.Dir, "pki", "hubble") }

// RelayTLSServerName is the name the relay's certificate carries (the
// chart's hubble.relay.tls.server: hubble-relay.<namespace>.svc).
const RelayTLSServerName = "hubble-relay." + ChartNamespace + ".svc"

// HubbleClientTLS are the files a client of a containerd lab's relay (or
// of an agent's Hubble port) needs: the CA and a client certificate.
func (s *State) HubbleClientTLS() (caFile, certFile, keyFile string) {
	d := s.HubbleTLSDir()
	return filepath.Join(d, "hubble-ca.crt"), filepath.Join(d, "client.crt"), filepath.Join(d, "client.key")
}

// createHubbleTLSSecrets makes the lab's Hubble CA and the certificates of
// the chart's TLS values, all signed by it: the agents' server certificate
// (every node's name, *.default.hubble-grpc.tendril.io, and the Peer
// service's), the relay's client certificate towards the agents, the
// relay's server certificate (its clients are checked against the same CA)
// and a client certificate for the user; then the three Secrets.
func createHubbleTLSSecrets(ctx context.Context, cs kubernetes.Interface, st *State) error {
	dir := st.HubbleTLSDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	ca, err := hubbletls.NewCA(dir, "hubble-ca", hubbleCertValidity)
	if err != nil {
		return err
	}
	issued := map[string]hubbletls.Pair{}
	for _, c := range []struct{ secret, name, dnsName string }{
		// A wildcard: hubbletls.ServerName of any node (and of the
		// relay's --peer-service-tls-server-name) in cluster "default".
		{hubbleServerSecret, "agents", hubbletls.ServerName("*", "default")},
		{hubbleRelayClientSecret, "relay-client", "relay.hubble-relay.tendril.io"},
		{hubbleRelayServerSecret, "relay-server", RelayTLSServerName},
		{"", "client", "client.hubble-relay.tendril.io"},
	} {
		p, err := ca.Issue(dir, c.name, hubbleCertValidity, c.dnsName)
		if err != nil {
			return err
		}
		if c.secret != "" {
			issued[c.secret] = p
		}
	}
	caPEM, err := os.ReadFile(ca.CertFile)
	if err != nil {
		return err
	}
	for name, p := range issued {
		crt, err := os.ReadFile(p.CertFile)
		if err != nil {
			return err
		}
		key, err := os.ReadFile(p.KeyFile)
		if err != nil {
			return err
		}
		sec := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ChartNamespace},
			Type:       corev1.SecretTypeTLS,
			Data:       map[string][]byte{corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: key, "ca.crt": caPEM},
		}
		if _, err := cs.CoreV1().Secrets(ChartNamespace).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create Secret %s/%s: %w", ChartNamespace, name, err)
		}
	}
	return nil
}
