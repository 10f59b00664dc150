package endpointpub

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
)

// fakeAPI is an API server's TendrilEndpoints that fails on demand.
type fakeAPI struct {
	mu     sync.Mutex
	objs   map[string]v1alpha1.TendrilEndpoint
	fail   error
	writes int
	// held, while set, blocks every call until closed (an API server
	// that does not answer).
	held chan struct{}
}

// hold blocks every call until the returned release is called.
func (f *fakeAPI) hold() (release func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	held := make(chan struct{})
	f.held = held
	return func() {
		f.mu.Lock()
		f.held = nil
		f.mu.Unlock()
		close(held)
	}
}

// gate waits while the API is held.
func (f *fakeAPI) gate() {
	f.mu.Lock()
	held := f.held
	f.mu.Unlock()
	if held != nil {
		<-held
	}
}

func (f *fakeAPI) Get(_ context.Context, ns, name string) (*v1alpha1.TendrilEndpoint, error) {
	f.gate()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return nil, f.fail
	}
	o, ok := f.objs[ns+"/"+name]
	if !ok {
		return nil, apierrors.NewNotFound(schema.GroupResource{Group: v1alpha1.GroupName, Resource: "tendrilendpoints"}, name)
	}
	return o.DeepCopy(), nil
}

func (f *fakeAPI) put(obj *v1alpha1.TendrilEndpoint) error {
	f.gate()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	f.writes++
	f.objs[obj.Namespace+"/"+obj.Name] = *obj.DeepCopy()
	return nil
}

func (f *fakeAPI) Create(_ context.Context, obj *v1alpha1.TendrilEndpoint) error { return f.put(obj) }
func (f *fakeAPI) Update(_ context.Context, obj *v1alpha1.TendrilEndpoint) error { return f.put(obj) }

func (f *fakeAPI) Delete(_ context.Context, ns, name string) error {
	f.gate()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	f.writes++
	delete(f.objs, ns+"/"+name)
	return nil
}

func (f *fakeAPI) List(context.Context) ([]v1alpha1.TendrilEndpoint, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []v1alpha1.TendrilEndpoint
	for _, o := range f.objs {
		out = append(out, o)
	}
	return out, nil
}

func (f *fakeAPI) setFail(err error) {
	f.mu.Lock()
	f.fail = err
	f.mu.Unlock()
}

// content is the objects as pod=nodeIP/identity.
func (f *fakeAPI) content() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for k, o := range f.objs {
		id := int64(0)
		if o.Status.Identity != nil {
			id = o.Status.Identity.ID
		}
		out = append(out, fmt.Sprintf("%s=%s/%d", k, o.Status.Networking.NodeIP, id))
	}
	sort.Strings(out)
	return fmt.Sprint(out)
}

func (f *fakeAPI) writeCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.writes
}

func status(nodeIP string, id int64) v1alpha1.EndpointStatus {
	return v1alpha1.EndpointStatus{ID: 1, Identity: &v1alpha1.EndpointIdentity{ID: id},
		Networking: &v1alpha1.EndpointNetworking{NodeIP: nodeIP, Addressing: []v1alpha1.AddressPair{{IPv4: "10.0.0.1"}}}}
}

func start(t *testing.T, api Client) *Publisher {
	t.Helper()
	var pub *Publisher
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	h := hive.New(statedb.Cell, job.Cell,
		cell.Provide(func() cell.Health { hl, _ := cell.NewSimpleHealth(); return hl }),
		cell.Module("endpointpub-test", "publisher under test",
			cell.Invoke(func(db *statedb.DB, jobs job.Registry, hl cell.Health, id cell.FullModuleID, log *slog.Logger) error {
				var err error
				pub, err = New(Params{DB: db, Jobs: jobs.NewGroup(hl), Log: log, ModuleID: id, Client: api,
					Owned:   func(tep *v1alpha1.TendrilEndpoint) bool { return tep.Status.Networking.NodeIP == "192.0.2.1" },
					Options: []reconciler.Option{reconciler.WithRetry(10*time.Millisecond, 50*time.Millisecond)}})
				return err
			})))
	if err := h.Start(quiet, context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Stop(quiet, context.Background()) })
	return pub
}

func eventually(t *testing.T, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok, msg := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(msg)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func statusOf(p *Publisher, key string) string {
	d, _, ok := p.Table().Get(p.DB().ReadTxn(), PodIndex.Query(key))
	if !ok {
		return "absent"
	}
	return d.Reconciliation.String()
}

// TestPublishRetriedWithoutWaiting: with the API server failing, Set and
// Delete return at once; the object is in Error with the message, and it
// is written once the API server answers, with no other event.
func TestPublishRetriedWithoutWaiting(t *testing.T) {
	api := &fakeAPI{objs: map[string]v1alpha1.TendrilEndpoint{}}
	api.setFail(errors.New("connection refused"))
	p := start(t, api)
	// Set and Delete return while the API server hangs: they only record
	// what to write. (The deadline only ends calls that never return.)
	release := api.hold()
	returned := make(chan error, 1)
	go func() {
		returned <- errors.Join(p.Set("shop", "web", status("192.0.2.1", 300)),
			p.Set("shop", "db", status("192.0.2.1", 301)), p.Delete("shop", "db"))
	}()
	select {
	case err := <-returned:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Set and Delete wait for the API server")
	}
	release()
	eventually(t, func() (bool, string) {
		s := statusOf(p, "shop/web")
		return strings.Contains(s, "connection refused"), "status " + s
	})
	api.setFail(nil)
	eventually(t, func() (bool, string) {
		got, want := api.content(), "[shop/web=192.0.2.1/300]"
		return got == want && strings.HasPrefix(statusOf(p, "shop/web"), "Done"), fmt.Sprintf("API server holds %s, want %s", got, want)
	})
	// An unchanged status writes nothing.
	writes := api.writeCount()
	if err := p.Set("shop", "web", status("192.0.2.1", 300)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if n := api.writeCount(); n != writes {
		t.Fatalf("an unchanged status was written again (%d writes, was %d)", n, writes)
	}
}

// TestPruneAfterRestore: objects of this node whose pods are gone are
// deleted only once the agent has restored its endpoints, and other
// nodes' objects are never touched.
func TestPruneAfterRestore(t *testing.T) {
	api := &fakeAPI{objs: map[string]v1alpha1.TendrilEndpoint{}}
	for _, o := range []struct{ ns, name, node string }{{"shop", "gone", "192.0.2.1"}, {"shop", "other-node", "192.0.2.2"}} {
		api.objs[o.ns+"/"+o.name] = v1alpha1.TendrilEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: o.ns, Name: o.name}, Status: status(o.node, 7)}
	}
	p := start(t, api)
	if err := p.Set("shop", "web", status("192.0.2.1", 300)); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() (bool, string) {
		got := api.content()
		return strings.Contains(got, "shop/web="), "API server holds " + got
	})
	time.Sleep(100 * time.Millisecond)
	if got := api.content(); !strings.Contains(got, "shop/gone") {
		t.Fatalf("pruned before the endpoints were restored: %s", got)
	}
	p.MarkRestored()
	eventually(t, func() (bool, string) {
		got, want := api.content(), "[shop/other-node=192.0.2.2/7 shop/web=192.0.2.1/300]"
		return got == want, fmt.Sprintf("API server holds %s, want %s", got, want)
	})
}
