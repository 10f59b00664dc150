package nodeids

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/nodemanager"
	"github.com/tendril-net/tendril/pkg/option"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// agent is one run of the cell over a nodes table the test writes, as
// the node manager does, with the API served on a unix socket.
type agent struct {
	h     *hive.Hive
	db    *statedb.DB
	nodes statedb.RWTable[*nodemanager.Peer]
	// done completes the table's initialization.
	done func(statedb.WriteTxn)
	sock string
	ids  *NodeIDs
}

func startAgent(t *testing.T, stateDir string) *agent {
	t.Helper()
	a := &agent{sock: filepath.Join(t.TempDir(), "api.sock")}
	var handlers server.HandlersIn
	a.h = hive.New(
		cell.Invoke(func(lifecycle.InvokedAll) {}),
		statedb.Cell,
		job.Cell,
		cell.Provide(
			func() option.Agent { return option.Agent{StateDir: stateDir} },
			nodemanager.NewTables,
			func(t nodemanager.Tables) statedb.Table[*nodemanager.Peer] { return t.Nodes },
			health.NewRegistry,
		),
		Cell,
		cell.Invoke(func(db *statedb.DB, tables nodemanager.Tables, in server.HandlersIn, ids *NodeIDs) {
			a.db, a.nodes, handlers, a.ids = db, tables.Nodes, in, ids
			wtxn := db.WriteTxn(tables.Nodes)
			a.done = tables.Nodes.RegisterInitializer(wtxn, "test")
			wtxn.Commit()
		}),
	)
	log := hivetest.Logger(t)
	if err := a.h.Start(log, context.Background()); err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	api, err := server.New(server.Config{Socket: a.sock}, quiet, nil)
	if err != nil {
		t.Fatal(err)
	}
	handlers.RegisterAll(api)
	if err := api.Listen(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = api.Serve() }()
	t.Cleanup(func() {
		_ = api.Stop(context.Background())
		_ = a.h.Stop(log, context.Background())
	})
	return a
}

func (a *agent) set(t *testing.T, complete bool, peers ...Node) {
	t.Helper()
	wtxn := a.db.WriteTxn(a.nodes)
	_ = a.nodes.DeleteAll(wtxn)
	for _, p := range peers {
		if _, _, err := a.nodes.Insert(wtxn, &nodemanager.Peer{Name: p.Name, IPs: p.IPs}); err != nil {
			t.Fatal(err)
		}
	}
	if complete {
		a.done(wtxn)
	}
	wtxn.Commit()
}

// list is `cilium-dbg nodeid list -o json` against the agent, polled
// until want accepts it.
func (a *agent) list(t *testing.T, bin string, want func([]*models.NodeID) bool) []*models.NodeID {
	t.Helper()
	var got []*models.NodeID
	var out []byte
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var err error
		out, err = exec.Command(bin, "-H", "unix://"+a.sock, "nodeid", "list", "-o", "json").CombinedOutput()
		if err != nil {
			t.Fatalf("cilium-dbg nodeid list: %v\n%s", err, out)
		}
		got = nil
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("cilium-dbg nodeid list -o json: %v\n%s", err, out)
		}
		if want(got) {
			return got
		}
	}
	t.Fatalf("cilium-dbg nodeid list never as expected; last:\n%s", out)
	return nil
}

func byIP(ids []*models.NodeID) map[string]int64 {
	m := map[string]int64{}
	for _, n := range ids {
		for _, ip := range n.Ips {
			m[ip] = *n.ID
		}
	}
	return m
}

// TestStockCiliumDbgNodeIDs: the stock cilium-dbg (v1.18.8) lists the
// agent's node IDs with each node's addresses (nodeid list, its table
// and -o json); an agent started again over the same state directory
// gives every node the ID it had, also to a node the nodes table lists
// only after a new node took an ID; a node gone once the table is
// complete leaves the list.
func TestStockCiliumDbgNodeIDs(t *testing.T) {
	out, err := exec.Command("../../../hack/cilium-dbg.sh").Output()
	testutil.Require(t, err == nil, "stock cilium-dbg not built: "+string(out))
	bin := strings.TrimSpace(string(out))
	state := t.TempDir()

	a := startAgent(t, state)
	a.set(t, true, node("node-b", "172.31.0.3", "fd00::3"), node("node-c", "172.31.0.4"))
	first := byIP(a.list(t, bin, func(ids []*models.NodeID) bool { return len(ids) == 2 }))
	if first["172.31.0.3"] != first["fd00::3"] || first["172.31.0.3"] == first["172.31.0.4"] || first["172.31.0.3"] < 1 || first["172.31.0.4"] < 1 {
		t.Fatalf("IDs by address %v: want one ID per node, distinct, from 1", first)
	}
	table, err := exec.Command(bin, "-H", "unix://"+a.sock, "nodeid", "list").CombinedOutput()
	if err != nil || !strings.Contains(string(table), "NODE ID") || !strings.Contains(string(table), "fd00::3") {
		t.Fatalf("cilium-dbg nodeid list: %v\n%s", err, table)
	}
	t.Logf("cilium-dbg nodeid list:\n%s", table)
	if err := a.h.Stop(hivetest.Logger(t), context.Background()); err != nil {
		t.Fatal(err)
	}

	// Restarted: node-d comes first, node-b only later; node-d must not
	// take node-b's ID in between.
	b := startAgent(t, state)
	b.set(t, false, node("node-d", "172.31.0.5"), node("node-c", "172.31.0.4"))
	b.list(t, bin, func(ids []*models.NodeID) bool { return len(ids) == 2 })
	b.set(t, true, node("node-d", "172.31.0.5"), node("node-c", "172.31.0.4"), node("node-b", "172.31.0.3"))
	second := byIP(b.list(t, bin, func(ids []*models.NodeID) bool { return len(ids) == 3 }))
	if second["172.31.0.3"] != first["172.31.0.3"] || second["172.31.0.4"] != first["172.31.0.4"] {
		t.Fatalf("after a restart: IDs %v, before %v", second, first)
	}
	if d := second["172.31.0.5"]; d == first["172.31.0.3"] || d == first["172.31.0.4"] || d < 1 {
		t.Fatalf("new node-d's ID %d collides: %v", d, second)
	}
	b.set(t, true, node("node-d", "172.31.0.5"))
	b.list(t, bin, func(ids []*models.NodeID) bool { return len(ids) == 1 && *ids[0].ID == second["172.31.0.5"] })
}

// TestLoopWaitsOnceTheTableIsInitialized: with the nodes table complete
// and unchanged, the loop waits. It waited on the table's initialization
// channel, which is closed once the table is, so it spun: an idle lab
// agent used 60-90% of a core in it. Counted in passes, not time: a
// quiet loop makes one pass per change, a spinning one thousands in the
// 200 ms watched.
func TestLoopWaitsOnceTheTableIsInitialized(t *testing.T) {
	a := startAgent(t, t.TempDir())
	a.set(t, true, Node{Name: "b", IPs: []netip.Addr{netip.MustParseAddr("172.31.0.2")}})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, ok := a.ids.ID("b"); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("node b never got an ID")
		}
	}
	time.Sleep(50 * time.Millisecond) // the pass after the last change
	before := a.ids.passes.Load()
	time.Sleep(200 * time.Millisecond)
	if n := a.ids.passes.Load() - before; n > 2 {
		t.Fatalf("%d passes of the loop over an unchanged, initialized nodes table in 200 ms, want at most 2", n)
	}
}
