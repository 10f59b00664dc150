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
// device EnsureDevice reports, fail the call that fails once.
type fakeKernel struct {
	calls   []string
	ifindex int
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
	expect(t, "first round", k.take(), "ensure vxlan 8472", "attach 5", "set 5", "remove but tendril_vxlan")
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
	expect(t, "device created again", k.take(), "ensure vxlan 8472", "attach 9", "set 9", "remove but tendril_vxlan")
}

// TestReconcileAttachFailure: programs that fail to attach leave from_pod
// pointing where it was (nowhere at first); the next round tries again.
func TestReconcileAttachFailure(t *testing.T) {
	k := &fakeKernel{ifindex: 5, fail: "attach"}
	tun := New(Config{RoutingMode: ModeTunnel, TunnelProtocol: "geneve"}, k, slog.New(slog.DiscardHandler))
	if err := tun.Reconcile(); err == nil {
		t.Fatal("a failed attach reconciled")
	}
	expect(t, "failed round", k.take(), "ensure geneve 6081", "attach 5")
	if tun.Device() != 0 {
		t.Errorf("device %d after a failed attach, want 0", tun.Device())
	}
	if err := tun.Reconcile(); err != nil {
		t.Fatal(err)
	}
	expect(t, "next round", k.take(), "ensure geneve 6081", "attach 5", "set 5", "remove but tendril_geneve")
}

// TestReconcileNative: from_pod stops redirecting before the programs and
// the devices go (a packet in flight never meets a device without them).
func TestReconcileNative(t *testing.T) {
	k := &fakeKernel{}
	tun := New(DefaultConfig(), k, slog.New(slog.DiscardHandler))
	if err := tun.Reconcile(); err != nil {
		t.Fatal(err)
	}
	expect(t, "native", k.take(), "set 0", "detach", "remove but ")
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
	if got := routingSection(c, tun).Lines[1].Value; got != "not created yet" {
		t.Errorf("before the first round: device %q", got)
	}
	if err := tun.Reconcile(); err != nil {
		t.Fatal(err)
	}
	if got := routingSection(c, tun).Lines[1].Value; got != "tendril_vxlan (ifindex 7)" {
		t.Errorf("after a round: device %q", got)
	}
	if got := routingSection(c, nil).Lines[1].Value; !strings.HasPrefix(got, "none") {
		t.Errorf("without the datapath: device %q", got)
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
