package agentdatapath

import (
	"fmt"
	"net/http"
	"net/netip"
	"path/filepath"
	"sort"

	"github.com/cilium/cilium/api/v1/models"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/option"
)

// mapNames are the short names of the datapath's maps and their pinned
// names. "ct" (both conntrack tables) is accepted too, as before the
// tables were split by family.
func mapNames() map[string]string { return maps.PinnedNames() }

// MapAPI serves GET /v1/map and /v1/map/{name}: the BPF maps' contents.
type MapAPI struct {
	// Datapath is nil without the datapath.
	Datapath *Module
	// BPFRoot is the bpffs directory the maps are pinned under.
	BPFRoot string
}

// Register adds the map API's handlers to the API server.
func (h *MapAPI) Register(api *server.Server) {
	api.Handle(http.MethodGet, "/v1/map", func(w http.ResponseWriter, r *http.Request) error {
		dm, err := h.datapathMaps()
		if err != nil {
			return err
		}
		list := &models.BPFMapList{Maps: []*models.BPFMap{}}
		names := make([]string, 0)
		for short := range mapNames() {
			names = append(names, short)
		}
		sort.Strings(names)
		for _, short := range names {
			m, err := h.mapModel(dm, short)
			if err != nil {
				return err
			}
			list.Maps = append(list.Maps, m)
		}
		server.WriteJSON(w, http.StatusOK, list)
		return nil
	})
	api.Handle(http.MethodGet, "/v1/map/{name}", func(w http.ResponseWriter, r *http.Request) error {
		dm, err := h.datapathMaps()
		if err != nil {
			return err
		}
		name := r.PathValue("name")
		short := ""
		if name == "ct" {
			short = "ct"
		}
		for s, full := range mapNames() {
			if name == s || name == full || name == filepath.Join(h.BPFRoot, full) {
				short = s
			}
		}
		if short == "" {
			return server.Errorf(http.StatusNotFound, "no map %q (maps: endpoints, ipcache, policy-cidr, policy, ct4, ct6, ct, metrics)", name)
		}
		m, err := h.mapModel(dm, short)
		if err != nil {
			return err
		}
		server.WriteJSON(w, http.StatusOK, m)
		return nil
	})
}

func (h *MapAPI) datapathMaps() (*maps.Maps, error) {
	if h.Datapath == nil || h.Datapath.loader.Maps() == nil {
		return nil, server.Errorf(http.StatusNotFound, "the datapath is not enabled on this agent")
	}
	return h.Datapath.loader.Maps(), nil
}

// mapModel renders a map's entries as key/value strings.
func (h *MapAPI) mapModel(dm *maps.Maps, short string) (*models.BPFMap, error) {
	path := filepath.Join(h.BPFRoot, mapNames()[short])
	if short == "ct" {
		path = filepath.Join(h.BPFRoot, maps.CT4MapName) + "," + filepath.Join(h.BPFRoot, maps.CT6MapName)
	}
	out := &models.BPFMap{Path: path, Cache: []*models.BPFMapEntry{}}
	add := func(k, v string) {
		out.Cache = append(out.Cache, &models.BPFMapEntry{Key: k, Value: v, DesiredAction: "sync"})
	}
	switch short {
	case "endpoints":
		eps, err := dm.EndpointMap().List()
		if err != nil {
			return nil, err
		}
		for _, e := range eps {
			add(fmt.Sprintf("ifindex=%d", e.IfIndex), fmt.Sprintf("id=%d identity=%d flags=%#02x ipv4=%s ipv6=%s mac=%s host-mac=%s",
				e.ID, e.Identity, e.Flags, mapAddr(e.IPv4), mapAddr(e.IPv6), e.MAC, e.HostMAC))
		}
	case "ipcache":
		entries, err := dm.IPCacheMap().Dump()
		if err != nil {
			return nil, err
		}
		for p, v := range entries {
			val := fmt.Sprintf("identity=%d", v.Identity)
			if v.TunnelIP.IsValid() {
				val += " tunnel=" + v.TunnelIP.String()
			}
			if v.Flags != 0 {
				val += fmt.Sprintf(" flags=%#02x", v.Flags)
			}
			add(p.String(), val)
		}
	case "policy-cidr":
		entries, err := dm.PolicyCIDRMap().Dump()
		if err != nil {
			return nil, err
		}
		for p, id := range entries {
			add(p.String(), fmt.Sprintf("identity=%d", id))
		}
	case "policy":
		entries, err := dm.PolicyMap().DumpEndpoint(0)
		if err != nil {
			return nil, err
		}
		for k, v := range entries {
			verdict := "allow"
			if v.Deny {
				verdict = "deny"
			}
			add(k.String(), fmt.Sprintf("%s cookie=%d", verdict, v.Cookie))
		}
	case "ct", "ct4", "ct6":
		entries, err := dm.CTMap().List()
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			if (short == "ct4" && !e.Src.Is4()) || (short == "ct6" && e.Src.Is4()) {
				continue
			}
			add(fmt.Sprintf("%s:%d -> %s:%d proto=%d", e.Src, e.SrcPort, e.Dst, e.DstPort, e.Proto),
				fmt.Sprintf("src-endpoint=%d dst-endpoint=%d reply=%v closing=%v tcp-flags=%#02x expires=%d",
					e.SrcEndpoint, e.DstEndpoint, e.SeenReply(), e.Closing(), e.TCPFlags, e.Expires))
		}
	case "metrics":
		rows, err := dm.MetricsMap().Dump()
		if err != nil {
			return nil, err
		}
		for _, r := range rows {
			add(fmt.Sprintf("%s %s", maps.ReasonName(r.Reason), maps.DirectionName(r.Direction)), fmt.Sprintf("packets=%d bytes=%d", r.Packets, r.Bytes))
		}
	}
	sort.Slice(out.Cache, func(i, j int) bool { return out.Cache[i].Key < out.Cache[j].Key })
	return out, nil
}

// mapAddr is an address, or "-" when there is none.
func mapAddr(a netip.Addr) string {
	if !a.IsValid() {
		return "-"
	}
	return a.String()
}

// apiHandlers serves the maps' API (which answers an error without the
// datapath).
func apiHandlers(m *Module, a option.Agent) server.HandlersOut {
	return server.Handlers((&MapAPI{Datapath: m, BPFRoot: a.BPFRoot}).Register)
}
