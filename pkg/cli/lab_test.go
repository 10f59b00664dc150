package cli

import "testing"

func TestValidDNSName(t *testing.T) {
	for _, ok := range []string{"backend", "backend.demo", "kubernetes.default.svc.cluster.local.", "my-svc.ns-1", "_dns._udp.kube-dns"} {
		if !validDNSName(ok) {
			t.Errorf("%q refused", ok)
		}
	}
	for _, bad := range []string{"", ".", "a..b", "-svc", "svc-", "sp ace", "x/y", "a.b:c", string(make([]byte, 254))} {
		if validDNSName(bad) {
			t.Errorf("%q accepted", bad)
		}
	}
}
