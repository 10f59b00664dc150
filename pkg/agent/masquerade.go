package agent

import (
	"github.com/cilium/hive/cell"

	"github.com/tendril-net/tendril/pkg/datapath/hostdev"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
)

// masqueradeCell is the host device programs (pkg/datapath/hostdev):
// masquerade at the node's uplinks. The agent gives it its settings and
// the pod datapath's loader; the conntrack GC collects its NAT entries
// (hostips.go) and `tendril status` shows it (api_daemon.go).
var masqueradeCell = cell.Group(
	cell.Provide(
		func(c Config) hostdev.Settings {
			return hostdev.Settings{Config: c.Masquerade, BPFRoot: c.BPFRoot, AttachMode: loader.AttachMode(c.DatapathAttachMode),
				L2Announcements: c.L2Announcements.Enabled}
		},
		func(dp *datapathModule) *loader.Loader {
			if dp == nil {
				return nil
			}
			return dp.loader
		},
	),
	hostdev.Cell,
)
