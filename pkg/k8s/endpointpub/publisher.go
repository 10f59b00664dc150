// Package endpointpub publishes this node's endpoints as TendrilEndpoint
// objects (CRD mode), so that other nodes learn their addresses,
// identities and named ports. The desired objects are a statedb table
// ("tendrilendpoints", one per pod) that the agent writes in a short
// transaction per endpoint event and returns: a CNI ADD never waits for
// the API server. A statedb reconciler creates, updates and deletes the
// objects, records each one's status, retries failures with backoff, and
// once the agent has restored its endpoints prunes the objects of this
// node whose pods are gone (deleted while the agent was down).
package endpointpub

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"reflect"
	"strconv"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	tendrilclient "github.com/tendril-net/tendril/pkg/k8s/client/clientset/versioned"
	"github.com/tendril-net/tendril/pkg/reconcile"
)

// TableName is the name of the publisher's table.
const TableName = "tendrilendpoints"

// InitializerRestore holds the prune back until the agent has restored
// its endpoints and published them into the table (MarkRestored).
const InitializerRestore = "agent-restore"

// WriteTimeout bounds one call to the API server. Retries, prunes and
// refreshes (every object rewritten every 30 minutes, so one someone
// edited or deleted comes back) follow reconcile's defaults.
const WriteTimeout = 10 * time.Second

// Desired is the TendrilEndpoint a local pod should have: the table's
// object, immutable once inserted.
type Desired struct {
	Namespace, Name string
	Status          v1alpha1.EndpointStatus
	// Reconciliation is the reconciler's status: pending, done, or error.
	Reconciliation reconciler.Status
}

// Key is the pod's namespace/name.
func (d *Desired) Key() string { return d.Namespace + "/" + d.Name }

// TableHeader implements statedb.TableWritable (`tendril statedb dump`).
func (d *Desired) TableHeader() []string {
	return []string{"Pod", "Endpoint", "Identity", "Addresses", "Status"}
}

// TableRow implements statedb.TableWritable.
func (d *Desired) TableRow() []string {
	id, addrs := "", ""
	if d.Status.Identity != nil {
		id = strconv.FormatInt(d.Status.Identity.ID, 10)
	}
	if n := d.Status.Networking; n != nil {
		for _, a := range n.Addressing {
			for _, s := range []string{a.IPv4, a.IPv6} {
				if s != "" {
					if addrs != "" {
						addrs += ","
					}
					addrs += s
				}
			}
		}
	}
	return []string{d.Key(), strconv.FormatInt(d.Status.ID, 10), id, addrs, d.Reconciliation.String()}
}

func (d *Desired) clone() *Desired {
	c := *d
	return &c
}

func (d *Desired) setStatus(s reconciler.Status) *Desired {
	d.Reconciliation = s
	return d
}

func (d *Desired) getStatus() reconciler.Status { return d.Reconciliation }

// PodIndex is the primary index: namespace/name.
var PodIndex = statedb.Index[*Desired, string]{
	Name: "pod",
	FromObject: func(d *Desired) index.KeySet {
		return index.NewKeySet(index.String(d.Key()))
	},
	FromKey:    index.String,
	FromString: index.FromString,
	Unique:     true,
}

// Client is the API server as the reconciler uses it (a test injects
// failures through it).
type Client interface {
	Get(ctx context.Context, namespace, name string) (*v1alpha1.TendrilEndpoint, error)
	Create(ctx context.Context, obj *v1alpha1.TendrilEndpoint) error
	Update(ctx context.Context, obj *v1alpha1.TendrilEndpoint) error
	Delete(ctx context.Context, namespace, name string) error
	// List returns every TendrilEndpoint, for the prune.
	List(ctx context.Context) ([]v1alpha1.TendrilEndpoint, error)
}

// Params builds a Publisher.
type Params struct {
	DB       *statedb.DB
	Jobs     job.Group
	Log      *slog.Logger
	ModuleID cell.FullModuleID
	Client   Client
	// Owned says whether an object in the API server is this node's (its
	// status names this node's address): only those are pruned.
	Owned func(*v1alpha1.TendrilEndpoint) bool
	// Options beyond the defaults, for tests.
	Options []reconciler.Option
}

// Publisher is the agent's API over the table.
type Publisher struct {
	db    *statedb.DB
	table statedb.RWTable[*Desired]

	restoredOnce sync.Once
	restored     func(statedb.WriteTxn)
}

// New creates the table and registers its reconciler on p.Jobs.
func New(p Params) (*Publisher, error) {
	tbl, err := statedb.NewTable(p.DB, TableName, PodIndex)
	if err != nil {
		return nil, fmt.Errorf("%s table: %w", TableName, err)
	}
	pub := &Publisher{db: p.DB, table: tbl}
	wtxn := p.DB.WriteTxn(tbl)
	pub.restored = tbl.RegisterInitializer(wtxn, InitializerRestore)
	wtxn.Commit()
	_, err = reconciler.Register(reconciler.Params{Log: p.Log, DB: p.DB, JobGroup: p.Jobs, ModuleID: p.ModuleID},
		tbl, (*Desired).clone, (*Desired).setStatus, (*Desired).getStatus,
		ops{client: p.Client, owned: p.Owned, log: p.Log}, nil,
		append([]reconciler.Option{reconciler.WithName(TableName), reconciler.WithPruning(reconcile.PruneInterval),
			reconciler.WithRefreshing(reconcile.Refresh, nil), reconciler.WithRetry(reconcile.RetryMin, reconcile.RetryMax)}, p.Options...)...)
	if err != nil {
		return nil, fmt.Errorf("%s reconciler: %w", TableName, err)
	}
	return pub, nil
}

// Table is the publisher's table, for inspection.
func (p *Publisher) Table() statedb.Table[*Desired] { return p.table }

// DB is the database the table is in.
func (p *Publisher) DB() *statedb.DB { return p.db }

// Set makes the pod's TendrilEndpoint hold status, in one short
// transaction; an unchanged status writes nothing.
func (p *Publisher) Set(namespace, name string, status v1alpha1.EndpointStatus) error {
	next := &Desired{Namespace: namespace, Name: name, Status: status, Reconciliation: reconciler.StatusPending()}
	wtxn := p.db.WriteTxn(p.table)
	defer wtxn.Abort()
	if old, _, found := p.table.Get(wtxn, PodIndex.Query(next.Key())); found && reflect.DeepEqual(old.Status, status) {
		return nil
	}
	if _, _, err := p.table.Insert(wtxn, next); err != nil {
		return fmt.Errorf("TendrilEndpoint %s: %w", next.Key(), err)
	}
	wtxn.Commit()
	return nil
}

// Delete makes the pod have no TendrilEndpoint.
func (p *Publisher) Delete(namespace, name string) error {
	wtxn := p.db.WriteTxn(p.table)
	defer wtxn.Abort()
	old, _, found := p.table.Get(wtxn, PodIndex.Query(namespace+"/"+name))
	if !found {
		return nil
	}
	if _, _, err := p.table.Delete(wtxn, old); err != nil {
		return fmt.Errorf("TendrilEndpoint %s/%s: %w", namespace, name, err)
	}
	wtxn.Commit()
	return nil
}

// MarkRestored says the restored endpoints are in the table: from now on
// the reconciler prunes this node's objects that no pod backs.
func (p *Publisher) MarkRestored() {
	p.restoredOnce.Do(func() {
		wtxn := p.db.WriteTxn(p.table)
		p.restored(wtxn)
		wtxn.Commit()
	})
}

// ops write the table's objects to the API server.
type ops struct {
	client Client
	owned  func(*v1alpha1.TendrilEndpoint) bool
	log    *slog.Logger
}

func (o ops) Update(ctx context.Context, _ statedb.ReadTxn, _ statedb.Revision, d *Desired) error {
	ctx, cancel := context.WithTimeout(ctx, WriteTimeout)
	defer cancel()
	cur, err := o.client.Get(ctx, d.Namespace, d.Name)
	if apierrors.IsNotFound(err) {
		obj := &v1alpha1.TendrilEndpoint{ObjectMeta: metav1.ObjectMeta{Name: d.Name, Namespace: d.Namespace}, Status: d.Status}
		if err := o.client.Create(ctx, obj); err != nil {
			return fmt.Errorf("create TendrilEndpoint %s: %w", d.Key(), err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("get TendrilEndpoint %s: %w", d.Key(), err)
	}
	if reflect.DeepEqual(cur.Status, d.Status) {
		return nil
	}
	cur = cur.DeepCopy()
	cur.Status = d.Status
	if err := o.client.Update(ctx, cur); err != nil {
		return fmt.Errorf("update TendrilEndpoint %s: %w", d.Key(), err)
	}
	return nil
}

func (o ops) Delete(ctx context.Context, _ statedb.ReadTxn, _ statedb.Revision, d *Desired) error {
	ctx, cancel := context.WithTimeout(ctx, WriteTimeout)
	defer cancel()
	if err := o.client.Delete(ctx, d.Namespace, d.Name); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete TendrilEndpoint %s: %w", d.Key(), err)
	}
	return nil
}

// Prune deletes this node's TendrilEndpoints whose pods have no endpoint
// here any more.
func (o ops) Prune(ctx context.Context, _ statedb.ReadTxn, objs iter.Seq2[*Desired, statedb.Revision]) error {
	if o.owned == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, WriteTimeout)
	defer cancel()
	have, err := o.client.List(ctx)
	if err != nil {
		return fmt.Errorf("list TendrilEndpoints: %w", err)
	}
	want := map[string]bool{}
	for d := range objs {
		want[d.Key()] = true
	}
	var errs []error
	for i := range have {
		tep := &have[i]
		if want[tep.Namespace+"/"+tep.Name] || !o.owned(tep) {
			continue
		}
		if err := o.client.Delete(ctx, tep.Namespace, tep.Name); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("prune TendrilEndpoint %s/%s: %w", tep.Namespace, tep.Name, err))
			continue
		}
		o.log.Info("Pruned a TendrilEndpoint of a pod no longer on this node", "pod", tep.Namespace+"/"+tep.Name)
	}
	return errors.Join(errs...)
}

// Clientset is the Client over the Tendril clientset.
type Clientset struct{ CS tendrilclient.Interface }

// Get implements Client.
func (c Clientset) Get(ctx context.Context, namespace, name string) (*v1alpha1.TendrilEndpoint, error) {
	return c.CS.TendrilV1alpha1().TendrilEndpoints(namespace).Get(ctx, name, metav1.GetOptions{})
}

// Create implements Client.
func (c Clientset) Create(ctx context.Context, obj *v1alpha1.TendrilEndpoint) error {
	_, err := c.CS.TendrilV1alpha1().TendrilEndpoints(obj.Namespace).Create(ctx, obj, metav1.CreateOptions{})
	return err
}

// Update implements Client.
func (c Clientset) Update(ctx context.Context, obj *v1alpha1.TendrilEndpoint) error {
	_, err := c.CS.TendrilV1alpha1().TendrilEndpoints(obj.Namespace).Update(ctx, obj, metav1.UpdateOptions{})
	return err
}

// Delete implements Client.
func (c Clientset) Delete(ctx context.Context, namespace, name string) error {
	return c.CS.TendrilV1alpha1().TendrilEndpoints(namespace).Delete(ctx, name, metav1.DeleteOptions{})
}

// List implements Client.
func (c Clientset) List(ctx context.Context) ([]v1alpha1.TendrilEndpoint, error) {
	l, err := c.CS.TendrilV1alpha1().TendrilEndpoints("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}
