package hostdev

import (
	"log/slog"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/tendril-net/tendril/pkg/testutil"
)

// TestStandaloneAgentTakesNoDefaultRouteDevice: without --devices, a
// standalone agent (no Kubernetes) leaves the machine's own uplink alone —
// it resolves no device although the machine has a default route — while
// the Kubernetes-mode agent (auto-detection) takes the default route's
// device, and a named device is taken either way.
func TestStandaloneAgentTakesNoDefaultRouteDevice(t *testing.T) {
	routes, err := netlink.RouteList(nil, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	var uplink string
	for _, r := range routes {
		if (r.Dst == nil || r.Dst.IP.IsUnspecified() && isZeroMask(r.Dst.Mask)) && r.LinkIndex > 0 {
			if l, err := netlink.LinkByIndex(r.LinkIndex); err == nil {
				uplink = l.Attrs().Name
				break
			}
		}
	}
	testutil.Require(t, uplink != "", "the machine has no default route to compare with")

	standalone := &Masquerade{cfg: DefaultConfig(), log: slog.New(slog.DiscardHandler)}
	devs, err := standalone.resolveDevices()
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 0 {
		t.Errorf("a standalone agent without --devices took %v", devs)
	}

	auto := &Masquerade{cfg: DefaultConfig(), log: slog.New(slog.DiscardHandler)}
	auto.SetAutoDevices(true)
	devs, err = auto.resolveDevices()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(devs, func(d Device) bool { return d.Name == uplink }) {
		t.Errorf("Kubernetes mode took %v, want the default route's %s", devs, uplink)
	}

	named := DefaultConfig()
	named.Devices = []string{uplink}
	devs, err = (&Masquerade{cfg: named, log: slog.New(slog.DiscardHandler)}).resolveDevices()
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 1 || devs[0].Name != uplink {
		t.Errorf("--devices %s: took %v", uplink, devs)
	}
}
