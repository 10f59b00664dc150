package loader

import (
	"errors"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

// legacyMaps are the pinned maps of the previous layout found at start,
// held open while their pins are removed so their entries can be carried
// over into the new maps.
type legacyMaps struct {
	endpoints, ipcache, ct, policy *ebpf.Map
	// ct4, ct6: conntrack of layout v1 per flow (16-bit reverse NAT IDs).
	ct4, ct6 *ebpf.Map
}

func (lm legacyMaps) close() {
	for _, m := range []*ebpf.Map{lm.endpoints, lm.ipcache, lm.ct, lm.policy, lm.ct4, lm.ct6} {
		if m != nil {
			m.Close()
		}
	}
}

// openLegacy opens the v1 pins that exist under the BPF root. A pin that
// cannot be opened is left to removeOtherLayouts.
func (l *Loader) openLegacy() legacyMaps {
	var lm legacyMaps
	for name, dst := range map[string]**ebpf.Map{
		maps.EndpointsV1MapName: &lm.endpoints, maps.IPCacheV1MapName: &lm.ipcache, maps.CTV1MapName: &lm.ct,
		maps.PolicyV1MapName: &lm.policy, maps.CT4V1MapName: &lm.ct4, maps.CT6V1MapName: &lm.ct6,
	} {
		m, err := ebpf.LoadPinnedMap(filepath.Join(l.cfg.BPFRoot, name), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				l.log.Warn("Cannot open pinned map of the previous layout; its entries are not carried over", "map", name, "error", err)
			}
			continue
		}
		*dst = m
	}
	return lm
}

// migrateLegacy copies the previous layout's endpoints, ipcache and
// conntrack entries into the new maps, before the pinned links switch to
// the new programs: from the first packet the new programs see, every pod
// has its endpoint entry, every peer its identity and every connection its
// conntrack entry, so nothing is dropped or re-evaluated while the agent
// regenerates the endpoints. Policy moves from the one trie of layouts v1
// and v2 into the endpoints' own tries. Conntrack goes last, so it misses
// as few flows as possible that the old programs create meanwhile. Metrics
// kept their layout and their pins. A failure costs the copy, not the
// start: the agent's regeneration rewrites endpoints, policy and the
// ipcache.
func (l *Loader) migrateLegacy(lm legacyMaps) {
	if lm.endpoints != nil {
		res, err := maps.MigrateEndpointsV1(lm.endpoints, l.maps.EndpointMap(), l.cfg.DirectDelivery)
		l.logMigration(maps.EndpointsV1MapName, res, err)
	}
	if lm.ipcache != nil {
		res, err := maps.MigrateIPCacheV1(lm.ipcache, l.maps.IPCacheMap())
		l.logMigration(maps.IPCacheV1MapName, res, err)
	}
	if lm.policy != nil {
		res, err := maps.MigratePolicyV1(lm.policy, l.maps.PolicyMap())
		l.logMigration(maps.PolicyV1MapName, res, err)
	}
	if lm.ct != nil {
		res, err := maps.MigrateCTV1(lm.ct, l.maps.CTMap(), maps.MonotonicNow())
		l.logMigration(maps.CTV1MapName, res, err)
	}
	// Conntrack v1 per flow: its entries become v2 entries with the
	// widened reverse NAT ID, so per-packet translated flows keep their
	// frontend on replies.
	if lm.ct4 != nil {
		res, err := maps.MigrateCTFlowV1(lm.ct4, l.maps.CTMap(), false, maps.MonotonicNow())
		l.logMigration(maps.CT4V1MapName, res, err)
	}
	if lm.ct6 != nil {
		res, err := maps.MigrateCTFlowV1(lm.ct6, l.maps.CTMap(), true, maps.MonotonicNow())
		l.logMigration(maps.CT6V1MapName, res, err)
	}
}

func (l *Loader) logMigration(name string, res maps.MigrationResult, err error) {
	if err != nil {
		l.log.Warn("Cannot carry entries over from a map of the previous layout", "map", name, "read", res.Read, "written", res.Written, "error", err)
		return
	}
	l.log.Info("Carried entries over from a map of the previous layout", "map", name, "read", res.Read, "written", res.Written)
}
