package hostdev

import (
	"strings"
	"testing"
)

func TestConfigValidate(t *testing.T) {
	def := DefaultConfig()
	if !def.EnableMasquerade {
		t.Fatal("masquerade must be on by default")
	}
	if min, max, err := def.PortRange(); err != nil || min != 61000 || max != 65535 {
		t.Fatalf("default range %d-%d (%v), want 61000-65535", min, max, err)
	}
	if dsr, err := def.DSR(); dsr || err != nil {
		t.Fatalf("default lb mode DSR %v (%v), want snat", dsr, err)
	}
	for _, tc := range []struct {
		mutate func(*Config)
		err    string
	}{
		{func(c *Config) {}, ""},
		{func(c *Config) { c.MasqueradePortRange = "62000-62000" }, ""},
		{func(c *Config) { c.MasqueradePortRange = "65000-64000" }, "masquerade-port-range"},
		{func(c *Config) { c.MasqueradePortRange = "80-90" }, "masquerade-port-range"},
		{func(c *Config) { c.MasqueradePortRange = "61000" }, "masquerade-port-range"},
		{func(c *Config) { c.MasqueradePortRange = "61000-70000" }, "masquerade-port-range"},
		{func(c *Config) { c.NonMasqueradeCIDRs = []string{"10.0.0.0/8", "192.168.1.7/16"} }, ""},
		{func(c *Config) { c.NonMasqueradeCIDRs = []string{"10.0.0.0/33"} }, "non-masquerade-cidrs"},
		{func(c *Config) { c.Devices = []string{"eth0", "bad name"} }, "devices"},
		{func(c *Config) { c.LBMode = LBModeDSR }, ""},
		{func(c *Config) { c.LBMode = "hybrid" }, `bpf-lb-mode "hybrid": want snat or dsr`},
		{func(c *Config) { c.LBMode = "" }, "bpf-lb-mode"},
	} {
		c := DefaultConfig()
		tc.mutate(&c)
		err := c.Validate()
		if (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%+v: error %v, want %q", c, err, tc.err)
		}
	}
	c := Config{NonMasqueradeCIDRs: []string{"192.168.1.7/16"}}
	ps, _ := c.NonMasqueradePrefixes()
	if len(ps) != 1 || ps[0].String() != "192.168.0.0/16" {
		t.Fatalf("prefixes %v, want the masked 192.168.0.0/16", ps)
	}
}

func TestAttachmentNames(t *testing.T) {
	for _, dir := range directions {
		idx, d, ok := parseAttachmentName(attachmentName(7, dir))
		if !ok || idx != 7 || d != dir {
			t.Fatalf("round trip of %s: %d %s %v", attachmentName(7, dir), idx, d, ok)
		}
	}
	// The pod programs' pins are not the host programs'.
	for _, n := range []string{"ep7-ingress", "dev-ingress", "dev0-egress", "devx-egress", "dev3-sideways"} {
		if _, _, ok := parseAttachmentName(n); ok {
			t.Errorf("%s parsed as a host device attachment", n)
		}
	}
}
