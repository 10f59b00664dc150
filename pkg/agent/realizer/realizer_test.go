package realizer

import (
	"context"
	"net/netip"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/agent/agentdatapath"
	"github.com/tendril-net/tendril/pkg/agent/agentendpoints"
	"github.com/tendril-net/tendril/pkg/agent/agentpolicy"
	"github.com/tendril-net/tendril/pkg/agent/epattach"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/dbinspect"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/identity/identitytable"
	"github.com/tendril-net/tendril/pkg/ipcache"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/logging"
	"github.com/tendril-net/tendril/pkg/metrics"
	"github.com/tendril-net/tendril/pkg/option"
	"github.com/tendril-net/tendril/pkg/policy/policycidr"
)

// record is the order in which the fakes below were written.
type record struct {
	mu     sync.Mutex
	events []string
}

func (r *record) add(e string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

func (r *record) get() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// allocator is the local allocator recording each allocation.
type allocator struct {
	*identity.LocalAllocator
	rec *record
}

func (a allocator) Allocate(labels []string) (identity.Identity, bool, error) {
	a.rec.add("identity")
	return a.LocalAllocator.Allocate(labels)
}

// backend is the BPF ipcache map, recording each write.
type backend struct{ rec *record }

func (b backend) Upsert(netip.Prefix, ipcache.Entry) error { b.rec.add("ipcache"); return nil }
func (b backend) Delete(netip.Prefix) error                { return nil }
func (b backend) Prefixes() ([]netip.Prefix, error)        { return nil, nil }

// kernel is the datapath's kernel side: the policy map's first read of an
// endpoint and the endpoint's attach are recorded.
type kernel struct{ rec *record }

func (k kernel) AttachEndpoint(loader.EndpointInfo) error { k.rec.add("attach"); return nil }
func (k kernel) DetachEndpoint(uint16, []netip.Addr) error {
	return nil
}
func (k kernel) CheckEndpoint(loader.EndpointInfo) (bool, error) { return false, nil }
func (k kernel) AttachedEndpoints() []uint16                     { return nil }
func (k kernel) EndpointIDs() ([]uint16, error)                  { return nil, nil }
func (k kernel) PurgeEndpoint(uint16) (bool, error)              { return false, nil }
func (k kernel) PolicyMap() agentdatapath.PolicyMap              { return policyMap(k) }

type policyMap struct{ rec *record }

func (p policyMap) DumpEndpoint(uint16) (map[maps.PolicyKey]maps.PolicyValue, error) {
	p.rec.add("policy-map")
	return nil, nil
}
func (p policyMap) Upsert(maps.PolicyKey, maps.PolicyValue) error { return nil }
func (p policyMap) Delete(maps.PolicyKey) error                   { return nil }
func (p policyMap) DeleteEndpoint(uint16) error                   { return nil }

// world is the rest of the agent around the realizer: the real endpoints
// (standalone, no host networking), policy and endpoints-table cells, a
// real ipcache, with the kernel, the ipcache map and the allocator faked
// (kern nil: no datapath).
func world(t *testing.T, rec *record, kern agentdatapath.Kernel) []cell.Cell {
	agent := option.DefaultAgent()
	agent.StateDir = filepath.Join(t.TempDir(), "state")
	return []cell.Cell{
		statedb.Cell,
		job.Cell,
		cell.Module("test-datapath", "The fakes of the datapath",
			cell.Provide(
				func() option.Agent { return agent },
				func() server.Config { return server.Config{Socket: filepath.Join(agent.StateDir, "t.sock")} },
				func() option.LocalNode { return option.LocalNode{Name: "node-a"} },
				func() agentendpoints.Kubernetes { return nil },
				func() *option.Runtime {
					return option.NewRuntime(option.RuntimeValues{PolicyEnforcement: option.EnforcementDefault})
				},
				func() identity.Allocator { return allocator{identity.NewLocalAllocator(), rec} },
				func(db *statedb.DB, a identity.Allocator, root cell.RootLogger) (*identitytable.Table, error) {
					return identitytable.New(db, a, logging.For(root, "identities"))
				},
				func() agentpolicy.Datapath { return nil },
				func() *policycidr.Table { return nil },
				func() agentpolicy.NamedPorts { return nil },
				func(m *agentendpoints.Module) agentpolicy.Endpoints { return m },
				func() *metrics.Server { return metrics.New(metrics.Config{}, hivetest.Logger(t)) },
				func() agentdatapath.Kernel { return kern },
				func() epattach.Kernel { return kern },
				func() epattach.Config { return epattach.Config{} },
				func(db *statedb.DB, jobs job.Registry, reg *health.Registry, id cell.FullModuleID, root cell.RootLogger) (*ipcache.IPCache, error) {
					return ipcache.New(ipcache.Params{DB: db, Jobs: jobs.NewGroup(reg.Scope("ipcache")), Log: logging.For(root, "ipcache"),
						ModuleID: id, Backend: backend{rec}})
				},
				health.NewRegistry,
				lifecycle.NewSteps,
				dbinspect.New,
			),
		),
		agentendpoints.Cell,
		agentpolicy.Cell,
		epattach.Cell,
	}
}

func start(t *testing.T, flags map[string]string, cells ...cell.Cell) {
	t.Helper()
	h := hive.New(append([]cell.Cell{cell.Invoke(func(lifecycle.InvokedAll) {})}, cells...)...)
	for k, v := range flags {
		h.Viper().Set(k, v)
	}
	log := hivetest.Logger(t)
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Stop(log, context.Background()); err != nil {
			t.Error(err)
		}
	})
}

var flags = map[string]string{"install-host-networking": "false", "ipv4-range": "10.77.3.0/24", "ipv6-range": "none"}

// TestRegenerationOrder: the realizer's regeneration of an endpoint
// writes, in this order, its identity, its ipcache entry (realized in the
// map before it goes on), its policy map state, then its object in the
// endpoints table, whose reconciler attaches it; the endpoint gets the
// identity of its labels, its row is in the table, and the realizer's
// start step ran.
func TestRegenerationOrder(t *testing.T) {
	rec := &record{}
	var (
		r     *Realizer
		tbl   *epattach.Table
		ids   identity.Allocator
		steps *lifecycle.Steps
		db    *statedb.DB
	)
	start(t, flags, append(world(t, rec, kernel{rec}), Cell,
		cell.Invoke(func(real *Realizer, et *epattach.Table, a identity.Allocator, s *lifecycle.Steps, d *statedb.DB) {
			r, tbl, ids, steps, db = real, et, a, s, d
		}))...)
	if r == nil {
		t.Fatal("no realizer with the datapath")
	}
	if !slices.Contains(steps.Names(), "identity-restore") {
		t.Fatalf("steps %v, want identity-restore", steps.Names())
	}
	ep := &endpoint.Endpoint{ID: 7, PodNamespace: "default", PodName: "web-0", Labels: []string{"k8s:app=web"},
		IPv4: netip.MustParseAddr("10.77.3.9"), HostIfIndex: 42}
	if err := r.Regenerate(context.Background(), ep); err != nil {
		t.Fatal(err)
	}
	if got, want := rec.get(), []string{"identity", "ipcache", "policy-map", "attach"}; !slices.Equal(got, want) {
		t.Fatalf("regeneration wrote %v, want %v", got, want)
	}
	want, _, err := ids.Allocate(agentpolicy.EndpointLabels(ep))
	if err != nil || identity.NumericIdentity(ep.Identity) != want.ID {
		t.Fatalf("endpoint identity %d, want %v of its labels (%v)", ep.Identity, want.ID, err)
	}
	if row, _, found := tbl.Table().Get(db.ReadTxn(), epattach.IDIndex.Query(ep.ID)); !found || row.Pod != "web-0" {
		t.Fatalf("endpoints table row %+v (found %v), want web-0", row, found)
	}
}

// TestNilWithoutDatapath: without the datapath's kernel the realizer is
// nil and appends no identity-restore step.
func TestNilWithoutDatapath(t *testing.T) {
	var (
		r     *Realizer
		steps *lifecycle.Steps
	)
	start(t, flags, append(world(t, &record{}, nil), Cell,
		cell.Invoke(func(real *Realizer, s *lifecycle.Steps) { r, steps = real, s }))...)
	if r != nil {
		t.Fatal("a realizer without the datapath")
	}
	if slices.Contains(steps.Names(), "identity-restore") {
		t.Fatalf("steps %v without the datapath include identity-restore", steps.Names())
	}
}

// TestRestoredKeptBeforeRegeneration: the endpoints the endpoint manager
// hands over as restored are in the endpoints table after the
// identity-restore step (their attachments survive the table's prune
// before they regenerate) and keep their identity numbers.
func TestRestoredKeptBeforeRegeneration(t *testing.T) {
	rec := &record{}
	var (
		tbl *epattach.Table
		ids identity.Allocator
		db  *statedb.DB
	)
	restored := &endpoint.Endpoint{ID: 9, PodNamespace: "default", PodName: "db-0", Labels: []string{"k8s:app=db"},
		IPv4: netip.MustParseAddr("10.77.3.20"), HostIfIndex: 43, Identity: 4242}
	start(t, flags, append(world(t, rec, kernel{rec}), Cell,
		cell.Invoke(func(real *Realizer, et *epattach.Table, a identity.Allocator, d *statedb.DB) {
			tbl, ids, db = et, a, d
			// As the endpoints' start step does, before identity-restore.
			real.Restored([]*endpoint.Endpoint{restored})
		}))...)
	row, _, found := tbl.Table().Get(db.ReadTxn(), epattach.IDIndex.Query(restored.ID))
	if !found || row.Pod != "db-0" {
		t.Fatalf("restored endpoint's row %+v (found %v), want db-0 kept", row, found)
	}
	ident, ok := ids.Lookup(identity.NumericIdentity(restored.Identity))
	if !ok || identity.LabelsKey(ident.Labels) != identity.LabelsKey(agentpolicy.EndpointLabels(restored)) {
		t.Fatalf("identity %d after restore: %+v (found %v), want the endpoint's labels reserved", restored.Identity, ident, ok)
	}
}
