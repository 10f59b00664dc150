package cli

import (
	"fmt"
	"io"
	"net/url"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/spf13/cobra"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

func newServiceCommand(opts *Options) *cobra.Command {
	cmd := &cobra.Command{Use: "service", Aliases: []string{"services", "svc"}, Short: "Inspect the services the datapath load-balances"}
	list := &cobra.Command{
		Use:   "list",
		Short: "List service frontends with their backends",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var out []*models.Service
			if err := doGet(cmd.Context(), opts, "/service", &out); err != nil {
				return err
			}
			if ok, err := opts.PrintStructured(cmd.OutOrStdout(), out); ok {
				return err
			}
			printServices(cmd.OutOrStdout(), out)
			return nil
		},
	}
	get := &cobra.Command{
		Use:   "get ID",
		Short: "Show one service frontend",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var s models.Service
			if err := doGet(cmd.Context(), opts, "/service/"+url.PathEscape(args[0]), &s); err != nil {
				return err
			}
			if ok, err := opts.PrintStructured(cmd.OutOrStdout(), s); ok {
				return err
			}
			printServices(cmd.OutOrStdout(), []*models.Service{&s})
			return nil
		},
	}
	cmd.AddCommand(list, get)
	return cmd
}

// printServices prints one line per backend, the frontend on the first.
func printServices(w io.Writer, svcs []*models.Service) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	defer tw.Flush()
	fmt.Fprintln(tw, "ID\tFRONTEND\tTYPE\tSERVICE\tBACKENDS\tREALIZED")
	for _, s := range svcs {
		sp := s.Spec
		if sp == nil || sp.FrontendAddress == nil {
			continue
		}
		fe := fmt.Sprintf("%s:%d/%s", sp.FrontendAddress.IP, sp.FrontendAddress.Port, sp.FrontendAddress.Protocol)
		if strings.Contains(sp.FrontendAddress.IP, ":") {
			fe = fmt.Sprintf("[%s]:%d/%s", sp.FrontendAddress.IP, sp.FrontendAddress.Port, sp.FrontendAddress.Protocol)
		}
		name, typ := "", ""
		if sp.Flags != nil {
			name, typ = sp.Flags.Namespace+"/"+sp.Flags.Name, sp.Flags.Type
			if sp.Flags.ExtTrafficPolicy == "Local" {
				typ += " (external: Local)"
			}
		}
		realized := s.Status != nil && s.Status.Realized != nil
		if len(sp.BackendAddresses) == 0 {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%v\n", sp.ID, fe, typ, name, "(none)", realized)
			continue
		}
		for i, b := range sp.BackendAddresses {
			ip := ""
			if b.IP != nil {
				ip = *b.IP
			}
			be := fmt.Sprintf("%s (%s)", ip+":"+fmt.Sprint(b.Port), b.State)
			if i == 0 {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%v\n", sp.ID, fe, typ, name, be, realized)
			} else {
				fmt.Fprintf(tw, "\t\t\t\t%s\t\n", be)
			}
		}
	}
}

// LBEntry is one frontend as `tendril bpf lb list` reads it from the pinned
// maps.
type LBEntry struct {
	Frontend string       `json:"frontend"`
	Service  maps.Service `json:"service"`
	Backends []LBBackend  `json:"backends"`
	Maglev   bool         `json:"maglev-table,omitempty"`
}

// LBBackend is a slot's backend.
type LBBackend struct {
	Slot    int    `json:"slot"`
	ID      uint32 `json:"id"`
	Address string `json:"address"`
	State   string `json:"state"`
}

// readLB reads every frontend with its slots' backends from the LB maps.
func readLB(m *maps.LBMaps) ([]LBEntry, error) {
	var out []LBEntry
	var iterErr error
	err := m.ServiceMap().Iterate(func(f maps.Frontend, s maps.Service) bool {
		e := LBEntry{Frontend: f.String(), Service: s, Backends: []LBBackend{}}
		ids, err := m.SlotMap().Get(s.ID, int(s.Count))
		if err != nil {
			iterErr = err
			return false
		}
		for i, id := range ids {
			b := LBBackend{Slot: i + 1, ID: id, Address: "(missing)"}
			if be, ok, err := m.BackendMap().Lookup(id); err != nil {
				iterErr = err
				return false
			} else if ok {
				b.Address, b.State = be.AddrPort().String(), maps.BackendStateNames()[be.State]
			}
			e.Backends = append(e.Backends, b)
		}
		_, e.Maglev, err = m.MaglevMap().Lookup(s.ID)
		if err != nil {
			iterErr = err
			return false
		}
		out = append(out, e)
		return true
	})
	if err == nil {
		err = iterErr
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Service.ID < out[j].Service.ID })
	return out, err
}

func svcFlagsString(f uint8) string {
	var parts []string
	for _, x := range []struct {
		bit  uint8
		name string
	}{{maps.SvcFlagAffinity, "affinity"}, {maps.SvcFlagMaglev, "maglev"}, {maps.SvcFlagInternalLocal, "internal-local"}, {maps.SvcFlagNoSocketLb, "no-socket-lb"}} {
		if f&x.bit != 0 {
			parts = append(parts, x.name)
		}
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ",")
}

// newBPFLBCommand is `tendril bpf lb list`: the LB maps as the datapath
// sees them, read from the pins (works while the agent is down).
func newBPFLBCommand(opts *Options, root *string) *cobra.Command {
	cmd := &cobra.Command{Use: "lb", Short: "List the service load-balancing maps"}
	cmd.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "List frontends with their service and reverse NAT IDs, flags and slots' backends",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, err := maps.OpenPinnedLB(*root, true)
			if err != nil {
				return err
			}
			defer m.Close()
			entries, err := readLB(m)
			if err != nil {
				return err
			}
			if ok, err := opts.PrintStructured(cmd.OutOrStdout(), entries); ok {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			defer tw.Flush()
			fmt.Fprintln(tw, "FRONTEND\tSERVICE-ID\tREVNAT-ID\tFLAGS\tBACKENDS")
			for _, e := range entries {
				flags := svcFlagsString(e.Service.Flags)
				if e.Service.Flags&maps.SvcFlagAffinity != 0 {
					flags += fmt.Sprintf(" (%ds)", e.Service.AffinityTimeout)
				}
				var bs []string
				for _, b := range e.Backends {
					bs = append(bs, fmt.Sprintf("%d=%s#%d(%s)", b.Slot, b.Address, b.ID, b.State))
				}
				if len(bs) == 0 {
					bs = []string{"(none)"}
				}
				fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\n", e.Frontend, e.Service.ID, e.Service.RevNATID, flags, strings.Join(bs, " "))
			}
			return nil
		},
	})
	return cmd
}
