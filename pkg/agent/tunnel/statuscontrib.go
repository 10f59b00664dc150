package tunnel

import (
	"fmt"

	"github.com/cilium/cilium/api/v1/models"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/status"
)

// statusOrder places this section in `tendril status` (pkg/status):
// after the datapath (30), before masquerade (40).
const statusOrder = 35

// statusContribution is the routing mode's section of `tendril status`
// and the Cilium v1 status's routing field (what `cilium-dbg status`
// prints as "Routing"). t is nil without the datapath: the mode is still
// what the nodes cell routes by.
func statusContribution(c Config, t *Tunnel, u Underlay6) status.Out {
	return status.Provide(status.Contribution{Order: statusOrder,
		Section: status.Always(func() ext.Section { return routingSection(c, t, u) }),
		Model: func(resp *ext.StatusResponse) {
			resp.Routing = &models.Routing{InterHostRoutingMode: "Native", IntraHostRoutingMode: "BPF"}
			if c.Tunneling() {
				resp.Routing.InterHostRoutingMode = "Tunnel"
				resp.Routing.TunnelProtocol = c.TunnelProtocol
			}
		}})
}

// routingSection says how pod traffic reaches other nodes and, in tunnel
// mode, on which device it leaves.
func routingSection(c Config, t *Tunnel, u Underlay6) ext.Section {
	sec := ext.Section{Title: "Routing"}
	if !c.Tunneling() {
		sec.Lines = []ext.Line{{Key: "Mode", Value: "native (each peer's pod CIDR routed via the peer)"}}
		return sec
	}
	under := "IPv4"
	if u {
		under = "IPv6"
	}
	sec.Lines = []ext.Line{{Key: "Mode", Value: fmt.Sprintf("tunnel (%s on UDP %d over an %s underlay, identity from the ipcache, pod MTU -%d)",
		c.TunnelProtocol, c.Port(), under, c.Overhead(bool(u)))}}
	dev := "not created yet"
	switch {
	case t == nil:
		dev = "none (no datapath)"
	case t.Device() != 0 && t.GeneveBPF():
		dev = fmt.Sprintf("%s (ifindex %d), a carrier: Geneve built and stripped in eBPF (the kernel has no Geneve module)", c.Device(), t.Device())
	case t.Device() != 0:
		dev = fmt.Sprintf("%s (ifindex %d)", c.Device(), t.Device())
	}
	sec.Lines = append(sec.Lines, ext.Line{Key: "Device", Value: dev})
	return sec
}
