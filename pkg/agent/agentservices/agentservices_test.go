package agentservices

import (
	"context"
	"net/netip"
	"testing"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"

	"github.com/tendril-net/tendril/pkg/agent/agentdatapath"
	"github.com/tendril-net/tendril/pkg/agent/agentk8s"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/loadbalancer"
	"github.com/tendril-net/tendril/pkg/option"
)

// TestTablesProvidedByType: the services cell (standalone, no datapath)
// provides its three tables by type, read-only; a service its writer
// inserts wakes a reader that took the services table by type (its watch
// channel) and yields a frontend in the frontends table.
func TestTablesProvidedByType(t *testing.T) {
	var (
		db        *statedb.DB
		m         *Module
		services  statedb.Table[*loadbalancer.Service]
		backends  statedb.Table[*loadbalancer.Backend]
		frontends statedb.Table[*loadbalancer.Frontend]
	)
	h := hive.New(
		cell.Invoke(func(lifecycle.InvokedAll) {}),
		statedb.Cell,
		job.Cell,
		cell.Provide(
			func() option.Agent { return option.DefaultAgent() },
			func() option.LocalNode { return option.LocalNode{Name: "node-a"} },
			func() loader.TraceMode { return loader.TraceOff },
			func() *agentk8s.Client { return nil },
			func() agentk8s.Config { return agentk8s.DefaultConfig() },
			func() *agentdatapath.Module { return nil },
			health.NewRegistry,
			lifecycle.NewSteps,
		),
		Cell,
		cell.Invoke(func(d *statedb.DB, mod *Module, s statedb.Table[*loadbalancer.Service],
			b statedb.Table[*loadbalancer.Backend], f statedb.Table[*loadbalancer.Frontend]) {
			db, m, services, backends, frontends = d, mod, s, b, f
		}),
	)
	log := hivetest.Logger(t)
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Stop(log, context.Background()); err != nil {
			t.Error(err)
		}
	})
	if services == nil || backends == nil || frontends == nil {
		t.Fatal("the services tables are not provided by type")
	}
	for tbl, want := range map[string]string{services.Name(): "services", backends.Name(): "backends", frontends.Name(): "frontends"} {
		if tbl != want {
			t.Errorf("table %q, want %q", tbl, want)
		}
	}
	_, watch := services.AllWatch(db.ReadTxn())
	name := loadbalancer.ServiceName{Namespace: "default", Name: "web"}
	addr := netip.MustParseAddr("10.96.0.10")
	if err := m.writer.UpsertService(&loadbalancer.Service{Name: name, Type: "ClusterIP", Addresses: []netip.Addr{addr},
		Ports: []loadbalancer.ServicePort{{Name: "http", Port: 80, Proto: 6}}}); err != nil {
		t.Fatal(err)
	}
	<-watch
	txn := db.ReadTxn()
	if _, _, ok := services.Get(txn, loadbalancer.ServiceByName.Query(name)); !ok {
		t.Fatal("the reader does not see the service the cell wrote")
	}
	var got []string
	for f := range frontends.List(txn, loadbalancer.FrontendByService.Query(name)) {
		got = append(got, f.Key.Addr.String())
	}
	if len(got) != 1 || got[0] != "10.96.0.10:80" {
		t.Fatalf("frontends of %s: %v, want [10.96.0.10:80]", name, got)
	}
}
