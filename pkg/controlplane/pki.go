package controlplane

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// PKI is the control plane's certificates and keys, written under a
// directory: file paths for the processes' flags, PEM bytes for kubeconfigs.
type PKI struct {
	CA, ServingCert, ServingKey, AdminCert, AdminKey, SAKey, SAPub string
	CAPEM, AdminCertPEM, AdminKeyPEM                               []byte
}

func writePEM(path, typ string, der []byte) ([]byte, error) {
	data := pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
	return data, os.WriteFile(path, data, 0o600)
}

// NewPKI makes a CA, a serving certificate for the API server (127.0.0.1,
// serviceIP, extraIPs such as the lab's node addresses, and the kubernetes
// service names), an admin client certificate (system:masters) and a
// service-account signing key, valid for validity.
func NewPKI(dir string, serviceIP net.IP, validity time.Duration, extraIPs ...net.IP) (*PKI, error) {
	p := &PKI{
		CA: filepath.Join(dir, "ca.crt"), ServingCert: filepath.Join(dir, "apiserver.crt"), ServingKey: filepath.Join(dir, "apiserver.key"),
		AdminCert: filepath.Join(dir, "admin.crt"), AdminKey: filepath.Join(dir, "admin.key"),
		SAKey: filepath.Join(dir, "sa.key"), SAPub: filepath.Join(dir, "sa.pub"),
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "tendril-test-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(validity),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("create CA: %w", err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	if p.CAPEM, err = writePEM(p.CA, "CERTIFICATE", caDER); err != nil {
		return nil, err
	}
	issue := func(serial int64, cn string, orgs []string, ips []net.IP, dns []string, usage x509.ExtKeyUsage, certPath, keyPath string) ([]byte, []byte, error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, nil, err
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn, Organization: orgs},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(validity),
			KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: ips, DNSNames: dns,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			return nil, nil, err
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return nil, nil, err
		}
		certPEM, err := writePEM(certPath, "CERTIFICATE", der)
		if err != nil {
			return nil, nil, err
		}
		keyPEM, err := writePEM(keyPath, "EC PRIVATE KEY", keyDER)
		return certPEM, keyPEM, err
	}
	if _, _, err := issue(2, "kube-apiserver", nil, append([]net.IP{net.ParseIP("127.0.0.1"), serviceIP}, extraIPs...),
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}, x509.ExtKeyUsageServerAuth, p.ServingCert, p.ServingKey); err != nil {
		return nil, fmt.Errorf("serving certificate: %w", err)
	}
	if p.AdminCertPEM, p.AdminKeyPEM, err = issue(3, "admin", []string{"system:masters"}, nil, nil, x509.ExtKeyUsageClientAuth, p.AdminCert, p.AdminKey); err != nil {
		return nil, fmt.Errorf("admin certificate: %w", err)
	}
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	if _, err := writePEM(p.SAKey, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(saKey)); err != nil {
		return nil, err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, err
	}
	if _, err := writePEM(p.SAPub, "PUBLIC KEY", pubDER); err != nil {
		return nil, err
	}
	return p, nil
}
