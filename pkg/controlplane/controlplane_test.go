package controlplane

import (
	"slices"
	"strings"
	"testing"
)

// TestControllerManagerArgsDualStack: one cluster CIDR keeps the single
// mask flag; an IPv4 and an IPv6 one take a mask per family (the
// controller manager refuses --node-cidr-mask-size with dual CIDRs).
func TestControllerManagerArgsDualStack(t *testing.T) {
	s := Spec{PKI: &PKI{}, ClusterCIDR: "10.244.0.0/16"}
	args := strings.Join(s.ControllerManagerArgs("kc"), " ")
	if !strings.Contains(args, "--node-cidr-mask-size 24") || strings.Contains(args, "ipv6") {
		t.Errorf("single stack: %s", args)
	}
	s = Spec{PKI: &PKI{}, ClusterCIDR: "10.244.0.0/16,fd00:10:244::/56", NodeCIDRMaskSizeIPv6: 64, ServiceCIDR: "10.96.0.0/16,fd00:10:96::/112"}
	a := s.ControllerManagerArgs("kc")
	joined := strings.Join(a, " ")
	for _, want := range []string{"--cluster-cidr 10.244.0.0/16,fd00:10:244::/56", "--node-cidr-mask-size-ipv4 24", "--node-cidr-mask-size-ipv6 64",
		"--service-cluster-ip-range 10.96.0.0/16,fd00:10:96::/112"} {
		if !strings.Contains(joined, want) {
			t.Errorf("dual stack: no %q in %s", want, joined)
		}
	}
	if slices.Contains(a, "--node-cidr-mask-size") {
		t.Errorf("dual stack with the single mask flag: %s", joined)
	}
	if api := strings.Join(s.APIServerArgs(), " "); !strings.Contains(api, "--service-cluster-ip-range 10.96.0.0/16,fd00:10:96::/112") {
		t.Errorf("API server without the dual service CIDR: %s", api)
	}
}
