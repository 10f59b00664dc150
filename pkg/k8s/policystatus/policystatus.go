// Package policystatus publishes this node's report on each Tendril policy
// object into the object's status: the Valid condition and, under
// status.nodes[<node>], whether the node imported the policy, whether
// every local endpoint enforces it yet, and at which policy revision (the
// per-node policy status the seeds describe).
//
// Reports live in a statedb table ("policy-status", one object per policy
// object); a statedb reconciler writes each change to the API server with
// retries. Each write is a JSON merge patch of the status subresource that
// names only this node's key (and the Valid condition, which every agent
// computes alike), so agents never overwrite one another's reports and
// never conflict on resourceVersion. A watcher callback only writes the
// table and returns.
package policystatus

import (
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"log/slog"
	"strconv"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
)

// TableName is the statedb table's name.
const TableName = "policy-status"

// Kinds of the policy objects reported on.
const (
	KindNetworkPolicy            = "TendrilNetworkPolicy"
	KindClusterwideNetworkPolicy = "TendrilClusterwideNetworkPolicy"
)

// Report is this node's report on one policy object.
type Report struct {
	Kind      string
	Namespace string // empty for cluster-wide policies
	Name      string
	// Generation is the object's generation the report is about.
	Generation int64
	// Revision is the node's policy revision that imported it (0 when it
	// was rejected).
	Revision uint64
	// Error is why the node rejected it; empty when imported.
	Error string
	// Conditions are the object's conditions as the watcher last saw
	// them, so the Valid condition keeps its transition time.
	Conditions []metav1.Condition `json:",omitempty"`
	// Enforcing: every local endpoint has realized Revision or later.
	Enforcing bool
	// Audited counts the connections the policy, in audit mode, would
	// have denied on this node.
	Audited uint64
	// Updated is when the report last changed.
	Updated time.Time
	Status  reconciler.Status
}

// Key is a report's primary key.
func (r *Report) Key() string { return key(r.Kind, r.Namespace, r.Name) }

func key(kind, ns, name string) string { return kind + "/" + ns + "/" + name }

// TableHeader implements statedb.TableWritable.
func (r *Report) TableHeader() []string {
	return []string{"Policy", "Generation", "Revision", "OK", "Enforcing", "Error", "Status"}
}

// TableRow implements statedb.TableWritable.
func (r *Report) TableRow() []string {
	return []string{r.Key(), strconv.FormatInt(r.Generation, 10), strconv.FormatUint(r.Revision, 10),
		strconv.FormatBool(r.Error == ""), strconv.FormatBool(r.Enforcing), r.Error, r.Status.String()}
}

func (r *Report) clone() *Report { c := *r; return &c }

func (r *Report) setStatus(s reconciler.Status) *Report { r.Status = s; return r }

func (r *Report) getStatus() reconciler.Status { return r.Status }

// KeyIndex is the primary index.
var KeyIndex = statedb.Index[*Report, string]{
	Name:       "key",
	FromObject: func(r *Report) index.KeySet { return index.NewKeySet(index.String(r.Key())) },
	FromKey:    index.String,
	FromString: index.FromString,
	Unique:     true,
}

// Patcher writes a merge patch into a policy object's status subresource.
type Patcher interface {
	PatchStatus(ctx context.Context, kind, namespace, name string, patch []byte) error
}

// Params builds a Publisher.
type Params struct {
	DB       *statedb.DB
	Jobs     job.Group
	Log      *slog.Logger
	ModuleID cell.FullModuleID
	// Node is this node's name: the key of its reports.
	Node    string
	Patcher Patcher
	Options []reconciler.Option
	// Now is the clock (tests).
	Now func() time.Time
}

// Publisher is the table and its reconciler. A nil Publisher records
// nothing (an agent part built without the API server's status writes).
type Publisher struct {
	db    *statedb.DB
	table statedb.RWTable[*Report]
	now   func() time.Time
}

// New creates the table and registers its reconciler on p.Jobs.
func New(p Params) (*Publisher, error) {
	tbl, err := statedb.NewTable(p.DB, TableName, KeyIndex)
	if err != nil {
		return nil, fmt.Errorf("%s table: %w", TableName, err)
	}
	now := p.Now
	if now == nil {
		now = time.Now
	}
	opts := append([]reconciler.Option{
		reconciler.WithName(TableName),
		// An API server that is away: retry from 1 s up to every minute.
		reconciler.WithRetry(time.Second, time.Minute),
	}, p.Options...)
	_, err = reconciler.Register(
		reconciler.Params{Log: p.Log, DB: p.DB, JobGroup: p.Jobs, ModuleID: p.ModuleID},
		tbl, (*Report).clone, (*Report).setStatus, (*Report).getStatus,
		ops{node: p.Node, patcher: p.Patcher}, nil, opts...)
	if err != nil {
		return nil, fmt.Errorf("%s reconciler: %w", TableName, err)
	}
	return &Publisher{db: p.DB, table: tbl, now: now}, nil
}

// Table is the statedb table, for inspection.
func (p *Publisher) Table() statedb.Table[*Report] { return p.table }

// Imported records that the node imported (rev > 0, verr nil) or rejected
// (verr) generation gen of a policy object, whose conditions the watcher
// saw as conds. The report is not enforcing until Realized says so.
func (p *Publisher) Imported(kind, ns, name string, gen int64, rev uint64, conds []metav1.Condition, verr error) {
	if p == nil {
		return
	}
	r := &Report{Kind: kind, Namespace: ns, Name: name, Generation: gen, Revision: rev, Conditions: conds,
		Updated: p.now(), Status: reconciler.StatusPending()}
	if verr != nil {
		r.Error, r.Revision = verr.Error(), 0
	}
	wtxn := p.db.WriteTxn(p.table)
	if old, _, found := p.table.Get(wtxn, KeyIndex.Query(r.Key())); found &&
		old.Generation == r.Generation && old.Revision == r.Revision && old.Error == r.Error {
		wtxn.Abort()
		return
	}
	_, _, _ = p.table.Insert(wtxn, r)
	wtxn.Commit()
}

// Removed forgets a deleted policy object.
func (p *Publisher) Removed(kind, ns, name string) {
	if p == nil {
		return
	}
	wtxn := p.db.WriteTxn(p.table)
	if old, _, found := p.table.Get(wtxn, KeyIndex.Query(key(kind, ns, name))); found {
		_, _, _ = p.table.Delete(wtxn, old)
	}
	wtxn.Commit()
}

// Realized says that every local endpoint has realized policy revision
// rev: reports of policies imported at rev or before become enforcing.
// It returns how many reports changed.
func (p *Publisher) Realized(rev uint64) int {
	if p == nil {
		return 0
	}
	becomes := func(r *Report) bool {
		return !r.Enforcing && r.Error == "" && r.Revision != 0 && r.Revision <= rev
	}
	// A job calls this every second: nothing to do takes no write lock.
	if !p.any(becomes) {
		return 0
	}
	wtxn := p.db.WriteTxn(p.table)
	n := 0
	for r := range p.table.All(wtxn) {
		if !becomes(r) {
			continue
		}
		c := r.clone()
		c.Enforcing, c.Updated, c.Status = true, p.now(), reconciler.StatusPending()
		_, _, _ = p.table.Insert(wtxn, c)
		n++
	}
	wtxn.Commit()
	return n
}

// Audited records how many connections each policy object, in audit
// mode, would have denied on this node (by Key: kind/namespace/name);
// reports whose count changed are published. It returns how many.
func (p *Publisher) Audited(counts map[string]uint64) int {
	if p == nil {
		return 0
	}
	changed := func(r *Report) bool { return counts[r.Key()] != r.Audited }
	if !p.any(changed) {
		return 0
	}
	wtxn := p.db.WriteTxn(p.table)
	n := 0
	for r := range p.table.All(wtxn) {
		if !changed(r) {
			continue
		}
		c := counts[r.Key()]
		nr := r.clone()
		nr.Audited, nr.Updated, nr.Status = c, p.now(), reconciler.StatusPending()
		_, _, _ = p.table.Insert(wtxn, nr)
		n++
	}
	wtxn.Commit()
	return n
}

// Key is a report's key for policy object kind/namespace/name.
func Key(kind, ns, name string) string { return key(kind, ns, name) }

// any reports whether a report satisfies pred, in a read transaction.
func (p *Publisher) any(pred func(*Report) bool) bool {
	for r := range p.table.All(p.db.ReadTxn()) {
		if pred(r) {
			return true
		}
	}
	return false
}

// Report is this node's current report on a policy object.
func (p *Publisher) Report(kind, ns, name string) (*Report, bool) {
	r, _, found := p.table.Get(p.db.ReadTxn(), KeyIndex.Query(key(kind, ns, name)))
	return r, found
}

// Patch is the merge patch of a report: the Valid condition (every agent
// computes it alike) and this node's key under nodes.
func Patch(node string, r *Report) ([]byte, error) {
	cond := metav1.Condition{Type: v1alpha1.ConditionValid, Status: metav1.ConditionTrue, Reason: "Valid",
		Message: "policy imported", ObservedGeneration: r.Generation}
	if r.Error != "" {
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "Invalid", r.Error
	}
	conds := append([]metav1.Condition(nil), r.Conditions...)
	apimeta.SetStatusCondition(&conds, cond)
	body := map[string]any{"status": map[string]any{
		"conditions": conds,
		"nodes": map[string]v1alpha1.NodePolicyStatus{node: {
			OK: r.Error == "", Error: r.Error, Enforcing: r.Enforcing, LocalPolicyRevision: r.Revision,
			ObservedGeneration: r.Generation, AuditedConnections: r.Audited, LastUpdated: metav1.NewTime(r.Updated.Truncate(time.Second)),
		}},
	}}
	b, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("policy status patch of %s: %w", r.Key(), err)
	}
	return b, nil
}

type ops struct {
	node    string
	patcher Patcher
}

func (o ops) Update(ctx context.Context, _ statedb.ReadTxn, _ statedb.Revision, r *Report) error {
	b, err := Patch(o.node, r)
	if err != nil {
		return err
	}
	if err := o.patcher.PatchStatus(ctx, r.Kind, r.Namespace, r.Name, b); err != nil {
		return fmt.Errorf("patch status of %s %s/%s: %w", r.Kind, r.Namespace, r.Name, err)
	}
	return nil
}

// Delete: the object is gone, and its status with it.
func (o ops) Delete(context.Context, statedb.ReadTxn, statedb.Revision, *Report) error { return nil }

// Prune: nothing to prune, the objects own their status.
func (o ops) Prune(context.Context, statedb.ReadTxn, iter.Seq2[*Report, statedb.Revision]) error {
	return nil
}
