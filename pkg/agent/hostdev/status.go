package hostdev

import (
	"fmt"
	"net/http"
	"net/netip"
	"path/filepath"
	"sort"
	"strings"

	"github.com/cilium/cilium/api/v1/models"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

// Status is the masquerade's state (GET /v1/masquerade, `tendril status`).
type Status struct {
	Enabled   bool     `json:"enabled"`
	Devices   []Device `json:"devices"`
	PortRange string   `json:"port-range"`
	// NonMasquerade are the prefixes that keep the pod's address: the
	// configured ones and the other nodes' pod CIDRs.
	NonMasquerade []string `json:"non-masquerade"`
	// Mappings are the NAT table's flows; Entries and Capacity its
	// entries (two per mapping).
	Mappings    int          `json:"mappings"`
	Entries     int          `json:"entries"`
	Capacity    int          `json:"capacity"`
	Attachments []Attachment `json:"attachments"`
	GC          GCStats      `json:"gc"`
	// Exhausted counts packets dropped because the port range had no
	// free port (REASON_MASQ_NO_PORT); TableFull for a full NAT table.
	Exhausted uint64 `json:"exhausted-drops"`
	TableFull uint64 `json:"table-full-drops"`
	// NodePort: services from outside are served at the devices
	// (--enable-node-port), a remote backend reached by LBMode
	// (--bpf-lb-mode: snat or dsr).
	NodePort bool   `json:"node-port"`
	LBMode   string `json:"lb-mode"`
}

// Status reads the masquerade's state.
func (m *Masquerade) Status() (Status, error) {
	st := Status{Enabled: m.cfg.EnableMasquerade, PortRange: m.cfg.MasqueradePortRange, NodePort: m.cfg.EnableNodePort, LBMode: m.cfg.LBMode}
	m.mu.Lock()
	st.Devices = append([]Device(nil), m.devices...)
	st.GC = m.gc
	prog := m.prog
	m.mu.Unlock()
	if prog != nil {
		st.Attachments = prog.Attachments()
	}
	dm := m.dp.Maps()
	if dm == nil {
		return st, fmt.Errorf("datapath maps not open")
	}
	nat := dm.NAT.NATMap()
	list, err := nat.List()
	if err != nil {
		return st, err
	}
	// The entries from the same walk: a mapping is two, an orphan one.
	st.Mappings = len(list)
	for _, n := range list {
		st.Entries += 2
		if n.Orphan {
			st.Entries--
		}
	}
	st.Capacity = nat.Capacity()
	prefixes, err := dm.NAT.NoMasquerade()
	if err != nil {
		return st, err
	}
	for _, p := range prefixes {
		st.NonMasquerade = append(st.NonMasquerade, p.String())
	}
	sort.Strings(st.NonMasquerade)
	if row, err := dm.MetricsMap().Lookup(maps.ReasonMasqNoPort, maps.DirEgress); err == nil {
		st.Exhausted = row.Packets
	}
	if row, err := dm.MetricsMap().Lookup(maps.ReasonMasqTableFull, maps.DirEgress); err == nil {
		st.TableFull = row.Packets
	}
	return st, nil
}

// StatusSection is the masquerade's part of `tendril status`.
func (m *Masquerade) StatusSection() ext.Section {
	sec := ext.Section{Title: "Masquerade"}
	add := func(k, v string) { sec.Lines = append(sec.Lines, ext.Line{Key: k, Value: v}) }
	st, err := m.Status()
	services := "off (--enable-node-port=false)"
	if st.NodePort {
		services = "on, remote backends by " + st.LBMode + " (--bpf-lb-mode)"
	}
	if !st.Enabled {
		add("state", "disabled (--enable-masquerade=false): pod traffic leaves with the pod's address")
		add("services from outside", services)
		return sec
	}
	var devs []string
	for _, d := range st.Devices {
		var as []string
		for _, ip := range []netip.Addr{d.IPv4, d.IPv6} {
			if ip.IsValid() {
				as = append(as, ip.String())
			}
		}
		if len(as) == 0 {
			as = []string{"no global address"}
		}
		devs = append(devs, fmt.Sprintf("%s (%s)", d.Name, strings.Join(as, ", ")))
	}
	if len(devs) == 0 {
		devs = []string{"none (no default route, no --devices)"}
	}
	add("state", "enabled, IPv4 and IPv6, in eBPF")
	add("devices", strings.Join(devs, ", "))
	add("port range", st.PortRange)
	add("NAT table", fmt.Sprintf("%d mappings, %d/%d entries", st.Mappings, st.Entries, st.Capacity))
	add("non-masquerade", strings.Join(st.NonMasquerade, ", ")+" (and every pod and node address the ipcache knows)")
	add("programs", fmt.Sprintf("%d attachments", len(st.Attachments)))
	add("drops", fmt.Sprintf("%d for an exhausted port range, %d for a full table", st.Exhausted, st.TableFull))
	add("services from outside", services)
	add("NAT GC", fmt.Sprintf("%d runs with conntrack GC, %d mappings and %d DSR records deleted", st.GC.Runs, st.GC.Deleted, st.GC.DSRDeleted))
	if err != nil {
		add("error", err.Error())
	}
	return sec
}

// registerAPI serves GET /v1/masquerade (the status) and GET /v1/map/nat
// (the NAT table, as the other maps are served).
func (m *Masquerade) registerAPI(api *server.Server) {
	api.Handle(http.MethodGet, "/v1/masquerade", func(w http.ResponseWriter, r *http.Request) error {
		st, err := m.Status()
		if err != nil {
			return err
		}
		server.WriteJSON(w, http.StatusOK, st)
		return nil
	})
	api.Handle(http.MethodGet, "/v1/map/nat", func(w http.ResponseWriter, r *http.Request) error {
		dm := m.dp.Maps()
		if dm == nil {
			return server.Errorf(http.StatusNotFound, "the datapath is not started")
		}
		list, err := dm.NAT.NATMap().List()
		if err != nil {
			return err
		}
		SortMappings(list)
		out := &models.BPFMap{Path: filepath.Join(m.root, maps.NAT4MapName), Cache: []*models.BPFMapEntry{}}
		for _, n := range list {
			k, v := mappingStrings(n)
			out.Cache = append(out.Cache, &models.BPFMapEntry{Key: k, Value: v, DesiredAction: "sync"})
		}
		server.WriteJSON(w, http.StatusOK, out)
		return nil
	})
}

// SortMappings orders mappings by node port, then pod.
func SortMappings(list []maps.NATMapping) {
	sort.Slice(list, func(i, j int) bool {
		a, b := list[i], list[j]
		if a.NodePort != b.NodePort {
			return a.NodePort < b.NodePort
		}
		return netip.AddrPortFrom(a.Pod, a.PodPort).Compare(netip.AddrPortFrom(b.Pod, b.PodPort)) < 0
	})
}

// ProtoName names the protocols masquerade translates.
func ProtoName(p uint8) string {
	switch p {
	case maps.ProtoTCP:
		return "tcp"
	case maps.ProtoUDP:
		return "udp"
	case 1:
		return "icmp"
	case 58:
		return "icmpv6"
	}
	return fmt.Sprint(p)
}

// mappingStrings renders a mapping as a key (the pod's flow) and a value
// (what it leaves with).
func mappingStrings(n maps.NATMapping) (string, string) {
	k := fmt.Sprintf("%s %s -> %s", ProtoName(n.Proto), netip.AddrPortFrom(n.Pod, n.PodPort), netip.AddrPortFrom(n.Remote, n.RemotePort))
	v := "via " + netip.AddrPortFrom(n.Node, n.NodePort).String()
	if n.Orphan {
		v += " (one direction only)"
	}
	return k, v
}
