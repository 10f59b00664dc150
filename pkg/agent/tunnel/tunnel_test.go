package tunnel

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/job"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/agent/agentendpoints"
	"github.com/tendril-net/tendril/pkg/agent/hostdev"
	"github.com/tendril-net/tendril/pkg/agent/nodes"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	dptunnel "github.com/tendril-net/tendril/pkg/datapath/tunnel"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/option"
	"github.com/tendril-net/tendril/pkg/status"
)

// fakeKernel records the reconciler's calls in order; ifindex is the
// device EnsureDevice or EnsureCarrier reports, module whether the kernel
// has Geneve, fail the call that fails once.
type fakeKernel struct {
	calls   []string
	ifindex int
	module  bool
	fail    string
}

func (k *fakeKernel) do(call string) error {
	k.calls = append(k.calls, call)
	if k.fail != "" && strings.HasPrefix(call, k.fail) {
		k.fail = ""
		return errors.New("injected: " + call)
	}
	return nil
}

func (k *fakeKernel) EnsureDevice(p dptunnel.Protocol, port uint16) (int, error) {
	if err := k.do(fmt.Sprintf("ensure %s %d", p, port)); err != nil {
		return 0, err
	}
	return k.ifindex, nil
}
func (k *fakeKernel) GeneveModule() (bool, error) {
	if err := k.do("probe geneve"); err != nil {
		return false, err
	}
	return k.module, nil
}
func (k *fakeKernel) EnsureCarrier() (int, error) {
	if err := k.do("carrier"); err != nil {
		return 0, err
	}
	return k.ifindex, nil
}
func (k *fakeKernel) SetGeneveBPF() error             { return k.do("geneve bpf on") }
func (k *fakeKernel) ClearGeneveCall() error          { return k.do("clear call") }
func (k *fakeKernel) RemoveDevices(keep string) error { return k.do("remove but " + keep) }
func (k *fakeKernel) Attach(ifindex int) error        { return k.do(fmt.Sprintf("attach %d", ifindex)) }
func (k *fakeKernel) Detach() error                   { return k.do("detach") }
func (k *fakeKernel) SetDevice(ifindex int) error     { return k.do(fmt.Sprintf("set %d", ifindex)) }

func (k *fakeKernel) take() []string {
	c := k.calls
	k.calls = nil
	return c
}

func expect(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s: calls %q, want %q", what, got, want)
	}
}

// TestReconcileTunnel: the device first, then its programs, then from_pod
// pointed at it (never a redirect to a device without programs), then
// the other protocol's device removed; a round with the device in place
// changes nothing but checks; a device created again (a new ifindex) gets
// the programs and the pointer again.
func TestReconcileTunnel(t *testing.T) {
	k := &fakeKernel{ifindex: 5}
	tun := New(Config{RoutingMode: ModeTunnel, TunnelProtocol: "vxlan"}, k, slog.New(slog.DiscardHandler))
	if err := tun.Reconcile(); err != nil {
		t.Fatal(err)
	}
	expect(t, "first round", k.take(), "ensure vxlan 8472", "attach 5", "set 5", "clear call", "remove but tendril_vxlan")
	if tun.Device() != 5 {
		t.Errorf("device %d, want 5", tun.Device())
	}
	if err := tun.Reconcile(); err != nil {
		t.Fatal(err)
	}
	expect(t, "device in place", k.take(), "ensure vxlan 8472", "remove but tendril_vxlan")
	k.ifindex = 9
	if err := tun.Reconcile(); err != nil {
		t.Fatal(err)
	}
	expect(t, "device created again", k.take(), "ensure vxlan 8472", "attach 9", "set 9", "clear call", "remove but tendril_vxlan")
}

// TestReconcileAttachFailure: programs that fail to attach leave from_pod
// pointing where it was (nowhere at first); the next round tries again.
// The kernel has the Geneve module: its device, probed once.
func TestReconcileAttachFailure(t *testing.T) {
	k := &fakeKernel{ifindex: 5, module: true, fail: "attach"}
	tun := New(Config{RoutingMode: ModeTunnel, TunnelProtocol: "geneve"}, k, slog.New(slog.DiscardHandler))
	if err := tun.Reconcile(); err == nil {
		t.Fatal("a failed attach reconciled")
	}
	expect(t, "failed round", k.take(), "probe geneve", "ensure geneve 6081", "attach 5")
	if tun.Device() != 0 {
		t.Errorf("device %d after a failed attach, want 0", tun.Device())
	}
	if err := tun.Reconcile(); err != nil {
		t.Fatal(err)
	}
	expect(t, "next round", k.take(), "ensure geneve 6081", "attach 5", "set 5", "clear call", "remove but tendril_geneve")
	if tun.GeneveBPF() {
		t.Error("Geneve in eBPF on a kernel with the Geneve module")
	}
}

// TestReconcileGeneveBPF: on a kernel without the Geneve module (probed
// once, a failed probe tried again), --tunnel-protocol geneve keeps the
// carrier instead of a device, attaches the programs to it and then
// turns Geneve in eBPF on (slot and flag), never pointing from_pod at a
// device; the VXLAN device goes. A round with the carrier in place only
// checks; a carrier created again gets the programs and the flag again;
// a failed SetGeneveBPF is tried again the next round.
func TestReconcileGeneveBPF(t *testing.T) {
	k := &fakeKernel{ifindex: 4, fail: "probe"}
	tun := New(Config{RoutingMode: ModeTunnel, TunnelProtocol: "geneve"}, k, slog.New(slog.DiscardHandler))
	if err := tun.Reconcile(); err == nil {
		t.Fatal("a failed probe reconciled")
	}
	expect(t, "failed probe", k.take(), "probe geneve")
	if err := tun.Reconcile(); err != nil {
		t.Fatal(err)
	}
	expect(t, "first round", k.take(), "probe geneve", "carrier", "attach 4", "geneve bpf on", "remove but tendril_geneve")
	if tun.Device() != 4 || !tun.GeneveBPF() {
		t.Errorf("device %d, Geneve in eBPF %v; want 4, true", tun.Device(), tun.GeneveBPF())
	}
	if err := tun.Reconcile(); err != nil {
		t.Fatal(err)
	}
	expect(t, "carrier in place", k.take(), "carrier", "remove but tendril_geneve")
	k.ifindex, k.fail = 8, "geneve bpf"
	if err := tun.Reconcile(); err == nil {
		t.Fatal("a failed SetGeneveBPF reconciled")
	}
	expect(t, "carrier created again, flag refused", k.take(), "carrier", "attach 8", "geneve bpf on")
	if err := tun.Reconcile(); err != nil {
		t.Fatal(err)
	}
	expect(t, "tried again", k.take(), "carrier", "attach 8", "geneve bpf on", "remove but tendril_geneve")
}

// TestReconcileGeneveBPFPort: Geneve in eBPF sends and matches UDP 6081
// only: another --tunnel-port is refused (no carrier, no flag) rather
// than run on a port the programs do not use.
func TestReconcileGeneveBPFPort(t *testing.T) {
	k := &fakeKernel{ifindex: 4}
	tun := New(Config{RoutingMode: ModeTunnel, TunnelProtocol: "geneve", TunnelPort: 7000}, k, slog.New(slog.DiscardHandler))
	err := tun.Reconcile()
	if err == nil || !strings.Contains(err.Error(), "tunnel-port 7000") {
		t.Fatalf("--tunnel-port 7000 with Geneve in eBPF: %v, want an error naming it", err)
	}
	expect(t, "refused", k.take(), "probe geneve")
	k.module = true
	if err := New(Config{RoutingMode: ModeTunnel, TunnelProtocol: "geneve", TunnelPort: 7000}, k, slog.New(slog.DiscardHandler)).Reconcile(); err != nil {
		t.Fatalf("--tunnel-port 7000 with the kernel's Geneve: %v", err)
	}
	expect(t, "kernel device", k.take(), "probe geneve", "ensure geneve 7000", "attach 4", "set 4", "clear call", "remove but tendril_geneve")
}

// TestReconcileGeneveBPFEncrypted: with WireGuard wrapping the tunnel,
// Geneve in eBPF is refused (its datagrams would pass the WireGuard
// device by), with no carrier and no flag; the kernel's Geneve device
// (whose datagrams the rule sends to WireGuard) is not.
func TestReconcileGeneveBPFEncrypted(t *testing.T) {
	k := &fakeKernel{ifindex: 4}
	tun := New(Config{RoutingMode: ModeTunnel, TunnelProtocol: "geneve"}, k, slog.New(slog.DiscardHandler))
	tun.encrypted = true
	if err := tun.Reconcile(); err == nil || !strings.Contains(err.Error(), "WireGuard") {
		t.Fatalf("Geneve in eBPF with WireGuard: %v, want an error naming WireGuard", err)
	}
	expect(t, "refused", k.take(), "probe geneve")
	k.module = true
	tun = New(Config{RoutingMode: ModeTunnel, TunnelProtocol: "geneve"}, k, slog.New(slog.DiscardHandler))
	tun.encrypted = true
	if err := tun.Reconcile(); err != nil {
		t.Fatalf("the kernel's Geneve with WireGuard: %v", err)
	}
}

// TestReconcileGeneveBPFSwitchBack: a node that ran Geneve in eBPF and is
// restarted with VXLAN or native routing turns the flag off (SetDevice
// writes the entry without it) before it empties the tail-call slot, and
// removes the carrier.
func TestReconcileGeneveBPFSwitchBack(t *testing.T) {
	k := &fakeKernel{ifindex: 4}
	if err := New(Config{RoutingMode: ModeTunnel, TunnelProtocol: "geneve"}, k, slog.New(slog.DiscardHandler)).Reconcile(); err != nil {
		t.Fatal(err)
	}
	k.take()
	k.ifindex = 6
	if err := New(Config{RoutingMode: ModeTunnel, TunnelProtocol: "vxlan"}, k, slog.New(slog.DiscardHandler)).Reconcile(); err != nil {
		t.Fatal(err)
	}
	expect(t, "to VXLAN", k.take(), "ensure vxlan 8472", "attach 6", "set 6", "clear call", "remove but tendril_vxlan")
	if err := New(DefaultConfig(), k, slog.New(slog.DiscardHandler)).Reconcile(); err != nil {
		t.Fatal(err)
	}
	expect(t, "to native", k.take(), "set 0", "clear call", "detach", "remove but ")
}

// TestReconcileNative: from_pod stops redirecting before the programs and
// the devices go (a packet in flight never meets a device without them).
func TestReconcileNative(t *testing.T) {
	k := &fakeKernel{}
	tun := New(DefaultConfig(), k, slog.New(slog.DiscardHandler))
	if err := tun.Reconcile(); err != nil {
		t.Fatal(err)
	}
	expect(t, "native", k.take(), "set 0", "clear call", "detach", "remove but ")
}

type provided struct {
	cell.In
	Config   Config
	Overhead agentendpoints.MTUOverhead
	Route    nodes.RouteDevice
	Tunnel   *Tunnel
	Status   []status.Contribution `group:"status-contributions"`
}

func newHive(flags map[string]string, out *provided) *hive.Hive {
	h := hive.New(
		cell.Invoke(func(lifecycle.InvokedAll) {}),
		job.Cell,
		cell.Provide(
			func() option.Agent { return option.Agent{BPFRoot: "/nonexistent"} },
			func() *loader.Loader { return nil },
			func() hostdev.Config { return hostdev.Config{LBMode: hostdev.LBModeSNAT} },
			health.NewRegistry,
		),
		Cell,
		cell.Invoke(func(p provided) { *out = p }),
	)
	for k, v := range flags {
		h.Viper().Set(k, v)
	}
	return h
}

// TestCellProvides: native by default (no overhead, routes via the
// peers); tunnel mode gives the pods' MTU the encapsulation's 50 bytes and
// the routes the protocol's device; without the datapath there is no
// reconciler.
func TestCellProvides(t *testing.T) {
	for _, c := range []struct {
		flags    map[string]string
		overhead int
		device   string
		port     uint16
		// mode is the status's Mode line and the Cilium model's modes.
		mode, model string
	}{
		{nil, 0, "", 8472, "native (", "Native/"},
		{map[string]string{"routing-mode": "tunnel"}, 50, "tendril_vxlan", 8472, "tunnel (vxlan on UDP 8472", "Tunnel/vxlan"},
		{map[string]string{"routing-mode": "tunnel", "tunnel-protocol": "geneve"}, 50, "tendril_geneve", 6081, "tunnel (geneve on UDP 6081", "Tunnel/geneve"},
		{map[string]string{"routing-mode": "tunnel", "tunnel-port": "4789"}, 50, "tendril_vxlan", 4789, "tunnel (vxlan on UDP 4789", "Tunnel/vxlan"},
	} {
		var p provided
		if err := newHive(c.flags, &p).Populate(hivetest.Logger(t)); err != nil {
			t.Fatalf("flags %v: %v", c.flags, err)
		}
		if int(p.Overhead) != c.overhead || string(p.Route) != c.device || p.Config.Port() != c.port {
			t.Errorf("flags %v: overhead %d, route device %q, port %d; want %d, %q, %d", c.flags, p.Overhead, p.Route, p.Config.Port(), c.overhead, c.device, c.port)
		}
		if p.Tunnel != nil {
			t.Errorf("flags %v: a reconciler without the datapath", c.flags)
		}
		secs := status.Sections(p.Status)
		if len(secs) != 1 || secs[0].Title != "Routing" || len(secs[0].Lines) == 0 || !strings.HasPrefix(secs[0].Lines[0].Value, c.mode) {
			t.Errorf("flags %v: status sections %+v, want Routing with a mode line %q...", c.flags, secs, c.mode)
		}
		var resp ext.StatusResponse
		status.FillModels(p.Status, &resp)
		if r := resp.Routing; r == nil || r.InterHostRoutingMode+"/"+r.TunnelProtocol != c.model || r.IntraHostRoutingMode != "BPF" {
			t.Errorf("flags %v: Cilium routing status %+v, want %s and BPF", c.flags, r, c.model)
		}
	}
}

// TestRoutingSectionDevice: in tunnel mode the section names the device
// the reconciler made, or says there is none yet.
func TestRoutingSectionDevice(t *testing.T) {
	c := Config{RoutingMode: ModeTunnel, TunnelProtocol: "vxlan"}
	k := &fakeKernel{ifindex: 7}
	tun := New(c, k, slog.Default())
	if got := routingSection(c, tun, false).Lines[1].Value; got != "not created yet" {
		t.Errorf("before the first round: device %q", got)
	}
	if err := tun.Reconcile(); err != nil {
		t.Fatal(err)
	}
	if got := routingSection(c, tun, false).Lines[1].Value; got != "tendril_vxlan (ifindex 7)" {
		t.Errorf("after a round: device %q", got)
	}
	if got := routingSection(c, nil, false).Lines[1].Value; !strings.HasPrefix(got, "none") {
		t.Errorf("without the datapath: device %q", got)
	}
	g := Config{RoutingMode: ModeTunnel, TunnelProtocol: "geneve"}
	gtun := New(g, &fakeKernel{ifindex: 3}, slog.Default())
	if err := gtun.Reconcile(); err != nil {
		t.Fatal(err)
	}
	if got := routingSection(g, gtun, false).Lines[1].Value; !strings.HasPrefix(got, "tendril_geneve (ifindex 3), a carrier: Geneve built and stripped in eBPF") {
		t.Errorf("Geneve in eBPF: device %q", got)
	}
}

// TestInvalidConfigRefused: an unknown mode or protocol fails Populate,
// marked as a configuration error naming the option.
func TestInvalidConfigRefused(t *testing.T) {
	for _, tc := range []struct{ flag, value string }{
		{"routing-mode", "overlay"},
		{"routing-mode", ""},
		{"tunnel-protocol", "gre"},
	} {
		var p provided
		err := newHive(map[string]string{tc.flag: tc.value}, &p).Populate(hivetest.Logger(t))
		if err == nil {
			t.Errorf("--%s=%q accepted", tc.flag, tc.value)
			continue
		}
		if !option.IsInvalid(err) || !strings.Contains(err.Error(), tc.flag+" ") {
			t.Errorf("--%s=%q: %v (invalid %v); want a configuration error naming the option", tc.flag, tc.value, err, option.IsInvalid(err))
		}
	}
}
