package bgpcp

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/bgp"
	"github.com/tendril-net/tendril/pkg/bgp/speaker"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/loadbalancer"
)

// recorder is a speaker that keeps the prefixes it was last given.
type recorder struct {
	mu    sync.Mutex
	paths []netip.Prefix
}

func (r *recorder) Apply(_ context.Context, d bgp.Desired, _ netip.Addr, _ bgp.Allowed) (speaker.Applied, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.paths = r.paths[:0]
	for _, a := range d.Adverts {
		r.paths = append(r.paths, a.Prefix)
	}
	return speaker.Applied{Paths: len(r.paths)}, nil
}

func (r *recorder) PeerStates(context.Context) ([]speaker.PeerState, error) { return nil, nil }

func (r *recorder) Announced() []netip.Prefix {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.paths)
}

type nopHealth struct{}

func (nopHealth) OK(string)                     {}
func (nopHealth) Stopped(string)                {}
func (nopHealth) Degraded(string, error)        {}
func (h nopHealth) NewScope(string) cell.Health { return h }
func (nopHealth) Close()                        {}

// TestRunAppliesAChangeAfterAQuietSpellAtOnce runs the control plane's
// loop in a bubble of virtual time (testing/synctest: time moves only
// when every goroutine waits, so "at once" is exact, not a wall-clock
// bound): a LoadBalancer address that arrives after a quiet spell is
// announced at the same instant, not after a fixed settle delay (which
// the loop waited after every change before: bench/bgp measured it in
// the lab). A second address right after the first is held until the
// settle time after the first's pass (it wrote the status), so a burst
// is still applied in batches.
func TestRunAppliesAChangeAfterAQuietSpellAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		db := statedb.New()
		tables, err := loadbalancer.NewTables(db)
		if err != nil {
			t.Fatal(err)
		}
		podCIDR := netip.MustParsePrefix("10.244.1.0/24")
		snap := Snapshot{NodeFound: true, RouterID: netip.MustParseAddr("172.30.0.11"),
			ClusterConfigs: []*v1alpha1.TendrilBGPClusterConfig{{ObjectMeta: metav1.ObjectMeta{Name: "all"},
				Spec: v1alpha1.BGPClusterConfigSpec{LocalASN: 65001, AdvertisementSelector: &metav1.LabelSelector{}}}},
			Adverts: []*v1alpha1.TendrilBGPAdvertisement{{ObjectMeta: metav1.ObjectMeta{Name: "a"},
				Spec: v1alpha1.BGPAdvertisementSpec{Advertisements: []v1alpha1.BGPAdvertisementEntry{
					{AdvertisementType: v1alpha1.BGPAdvertService, Service: &v1alpha1.BGPServiceAdvertisement{
						Addresses: []string{v1alpha1.BGPServiceAddressLoadBalancerIP}}}}}}},
			Pools: []*v1alpha1.TendrilLoadBalancerIPPool{{ObjectMeta: metav1.ObjectMeta{Name: "lb"},
				Spec: v1alpha1.LoadBalancerIPPoolSpec{Blocks: []v1alpha1.LoadBalancerIPBlock{{CIDR: "192.0.2.240/28"}}}}},
		}
		var mu sync.Mutex
		var writes []time.Time
		source := func(context.Context) (func() Snapshot, <-chan struct{}, StatusWriter, error) {
			write := func(context.Context, string, *v1alpha1.BGPNodeStatus) error {
				mu.Lock()
				defer mu.Unlock()
				writes = append(writes, time.Now())
				return nil
			}
			return func() Snapshot { return snap }, make(chan struct{}), write, nil
		}
		// gobgp's server goroutine never ends (a bubble must), so the
		// passes apply to a recorder.
		sp := &recorder{}
		cp := &ControlPlane{node: "node-1", log: slog.New(slog.DiscardHandler), db: db, services: tables.Services,
			backends: tables.Backends, source: source, apply: sp, metrics: newPeerMetrics(),
			podCIDRs: func() []netip.Prefix { return []netip.Prefix{podCIDR} }}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- cp.run(ctx, nopHealth{}) }()
		defer func() {
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		}()

		announced := func(addr string) bool {
			return slices.Contains(sp.Announced(), netip.PrefixFrom(netip.MustParseAddr(addr), 32))
		}
		addService := func(name, addr string) {
			txn := db.WriteTxn(tables.Services)
			if _, _, err := tables.Services.Insert(txn, &loadbalancer.Service{Name: loadbalancer.ServiceName{Namespace: "default", Name: name},
				LoadBalancerIPs: []netip.Addr{netip.MustParseAddr(addr)}}); err != nil {
				t.Fatal(err)
			}
			txn.Commit()
		}

		// A quiet spell, well past every gap.
		time.Sleep(time.Second)
		synctest.Wait()
		start := time.Now()
		addService("web", "192.0.2.241")
		synctest.Wait()
		if !announced("192.0.2.241") {
			t.Fatalf("192.0.2.241 not announced at once after a quiet spell (announced %v after %s of virtual time)", sp.Announced(), time.Since(start))
		}

		// The first's pass wrote the status: the next change waits for
		// the rest of settle, then is applied.
		addService("api", "192.0.2.242")
		synctest.Wait()
		if announced("192.0.2.242") {
			t.Fatalf("192.0.2.242 announced within the settle time after a pass that wrote the status")
		}
		time.Sleep(settle)
		synctest.Wait()
		if !announced("192.0.2.242") {
			t.Fatalf("192.0.2.242 not announced %s after the previous pass", settle)
		}
		mu.Lock()
		defer mu.Unlock()
		for i := 1; i < len(writes); i++ {
			if gap := writes[i].Sub(writes[i-1]); gap < settle {
				t.Errorf("status writes %s apart, below settle %s", gap, settle)
			}
		}
	})
}

// TestPassGap: a quick pass that wrote nothing leaves quietGap to the
// next; a slower one ten times its time, up to settle; one that wrote the
// status settle.
func TestPassGap(t *testing.T) {
	for _, c := range []struct {
		took  time.Duration
		wrote bool
		want  time.Duration
	}{
		{100 * time.Microsecond, false, quietGap},
		{5 * time.Millisecond, false, 50 * time.Millisecond},
		{30 * time.Millisecond, false, settle},
		{100 * time.Microsecond, true, settle},
		{30 * time.Millisecond, true, settle},
	} {
		if got := passGap(c.took, c.wrote); got != c.want {
			t.Errorf("passGap(%s, %v) = %s, want %s", c.took, c.wrote, got, c.want)
		}
	}
}
