package bgpcp

import (
	"fmt"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/status"
)

// OrderBGP places the BGP section of `tendril status` after the
// services' (status.OrderServices) and before Hubble's.
const OrderBGP = 65

// statusContribution is the BGP section; none with the control plane
// off.
func statusContribution(cp *ControlPlane) status.Out {
	if cp == nil {
		return status.Out{}
	}
	return status.Provide(status.Contribution{Order: OrderBGP, Section: status.Always(cp.StatusSection)})
}

// StatusSection is the config the node runs, its sessions and what it
// announces or refuses.
func (cp *ControlPlane) StatusSection() ext.Section {
	p := cp.Last()
	sec := ext.Section{Title: "BGP control plane"}
	switch {
	case p.Waiting != "":
		sec.Lines = append(sec.Lines, ext.Line{Key: "State", Value: "waiting for " + p.Waiting})
	case p.Desired.Config == "":
		sec.Lines = append(sec.Lines, ext.Line{Key: "State", Value: "no TendrilBGPClusterConfig selects this node"})
	default:
		est := 0
		for _, ps := range p.Peers {
			if ps.State == "established" {
				est++
			}
		}
		sec.Lines = append(sec.Lines,
			ext.Line{Key: "Config", Value: fmt.Sprintf("%s (ASN %d, router ID %s)", p.Desired.Config, p.Desired.LocalASN, p.RouterID)},
			ext.Line{Key: "Peers", Value: fmt.Sprintf("%d/%d established", est, len(p.Peers))},
			ext.Line{Key: "Announced", Value: fmt.Sprintf("%d prefixes, %d refused", p.Applied.Paths, len(p.Desired.Refused))})
		for _, ps := range p.Peers {
			if ps.State != "established" {
				v := ps.State
				if ps.Reason != "" {
					v += ": " + ps.Reason
				}
				sec.Lines = append(sec.Lines, ext.Line{Key: "Peer " + ps.Name, Value: v})
			}
		}
	}
	for _, e := range p.Desired.Errors {
		sec.Lines = append(sec.Lines, ext.Line{Key: "Error", Value: e})
	}
	if p.Err != "" {
		sec.Lines = append(sec.Lines, ext.Line{Key: "Error", Value: p.Err})
	}
	for _, r := range p.Desired.Refused {
		sec.Lines = append(sec.Lines, ext.Line{Key: "Refused", Value: r.String()})
	}
	return sec
}
