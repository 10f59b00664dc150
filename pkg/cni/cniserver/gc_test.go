package cniserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/tendril-net/tendril/pkg/cni"
	"github.com/tendril-net/tendril/pkg/endpoint"
)

var errNotFound = errors.New("endpoint not found")

// fakeEndpoints is an endpoint manager in memory: GC's decisions are the
// logic under test, not the datapath behind Delete.
type fakeEndpoints struct {
	mu      sync.Mutex
	eps     map[uint16]*endpoint.Endpoint
	deleted []uint16
}

func newFakeEndpoints(eps ...*endpoint.Endpoint) *fakeEndpoints {
	f := &fakeEndpoints{eps: map[uint16]*endpoint.Endpoint{}}
	for _, ep := range eps {
		f.eps[ep.ID] = ep
	}
	return f
}

func (f *fakeEndpoints) Create(_ context.Context, ep *endpoint.Endpoint) (*endpoint.Endpoint, error) {
	return nil, errors.New("not used")
}

func (f *fakeEndpoints) Lookup(id string) (*endpoint.Endpoint, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, ep := range f.eps {
		if id == "cni-attachment-id:"+ep.AttachmentID() || id == fmt.Sprint(ep.ID) {
			return ep.Clone(), nil
		}
	}
	return nil, errNotFound
}

func (f *fakeEndpoints) Delete(_ context.Context, id uint16) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.eps[id]; !ok {
		return errNotFound
	}
	delete(f.eps, id)
	f.deleted = append(f.deleted, id)
	return nil
}

func (f *fakeEndpoints) List() []*endpoint.Endpoint {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*endpoint.Endpoint
	for _, ep := range f.eps {
		out = append(out, ep.Clone())
	}
	return out
}

func (f *fakeEndpoints) IsNotFound(err error) bool { return errors.Is(err, errNotFound) }

func (f *fakeEndpoints) has(id uint16) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.eps[id]
	return ok
}

// gcServer is a Server with only what GC uses: the endpoints, a netlink
// handle of the test's namespace (the veths GC looks up do not exist
// there) and a fixed clock.
func gcServer(t *testing.T, eps *fakeEndpoints, now time.Time) *Server {
	t.Helper()
	nl, err := netlink.NewHandle()
	if err != nil {
		t.Fatalf("netlink handle: %v", err)
	}
	t.Cleanup(func() { nl.Close() })
	return &Server{
		deps:   Deps{Endpoints: eps, Netlink: nl, GCGracePeriod: time.Minute},
		log:    slog.New(slog.DiscardHandler),
		now:    func() time.Time { return now },
		owners: map[string]*ownerLock{},
	}
}

func gcRequest(conf string) *cni.Request {
	return &cni.Request{Config: []byte(conf)}
}

const gcConfNoList = `{"cniVersion":"1.1.0","name":"tendril","type":"tendril-cni"}`

func podEndpoint(id uint16, cid, network string, created time.Time) *endpoint.Endpoint {
	return &endpoint.Endpoint{ID: id, ContainerID: cid, IfName: "eth0", NetworkName: network, Created: created}
}

// TestGCWithoutValidAttachments: the spec makes cni.dev/valid-attachments
// GC's input; a GC without it must not read as "nothing is valid".
func TestGCWithoutValidAttachments(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	old := now.Add(-time.Hour)
	eps := newFakeEndpoints(podEndpoint(1, "c1", "tendril", old), podEndpoint(2, "c2", "tendril", old))
	s := gcServer(t, eps, now)
	err := s.gc(context.Background(), gcRequest(gcConfNoList))
	if err == nil {
		t.Fatal("GC without cni.dev/valid-attachments succeeded")
	}
	if err.Code != cni.ErrInvalidNetworkConfig || !strings.Contains(err.Msg, "cni.dev/valid-attachments") {
		t.Errorf("GC without the list: code %d %q, want %d naming cni.dev/valid-attachments", err.Code, err.Error(), cni.ErrInvalidNetworkConfig)
	}
	for _, id := range []uint16{1, 2} {
		if !eps.has(id) {
			t.Errorf("GC without the list deleted endpoint %d", id)
		}
	}
}

// TestGCOnlyItsNetwork: GC of one network leaves the endpoints of another
// network and those without a recorded network (REST API, older state
// files) alone.
func TestGCOnlyItsNetwork(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	old := now.Add(-time.Hour)
	eps := newFakeEndpoints(
		podEndpoint(1, "c1", "tendril", old),    // stale, this network
		podEndpoint(2, "c2", "tendril", old),    // valid
		podEndpoint(3, "c3", "other", old),      // another network's
		podEndpoint(4, "c4", "", old),           // restored without a network
		&endpoint.Endpoint{ID: 5, Created: old}, // host/health: no container
	)
	s := gcServer(t, eps, now)
	conf := `{"cniVersion":"1.1.0","name":"tendril","type":"tendril-cni","cni.dev/valid-attachments":[{"containerID":"c2","ifname":"eth0"}]}`
	if err := s.gc(context.Background(), gcRequest(conf)); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if eps.has(1) {
		t.Error("GC kept the stale endpoint 1 of its own network")
	}
	for _, id := range []uint16{2, 3, 4, 5} {
		if !eps.has(id) {
			t.Errorf("GC of network tendril deleted endpoint %d", id)
		}
	}
	// An empty list is a valid answer: nothing of this network is valid.
	conf = `{"cniVersion":"1.1.0","name":"other","type":"tendril-cni","cni.dev/valid-attachments":[]}`
	if err := s.gc(context.Background(), gcRequest(conf)); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if eps.has(3) {
		t.Error("GC of network other with an empty list kept its endpoint 3")
	}
	for _, id := range []uint16{2, 4, 5} {
		if !eps.has(id) {
			t.Errorf("GC of network other deleted endpoint %d", id)
		}
	}
}

// TestGCKeepsAddsInFlight: an ADD that finished after the runtime listed
// its valid attachments (or finishes while GC runs) is not in the list
// yet; GC keeps endpoints younger than the grace period or created after
// GC started.
func TestGCKeepsAddsInFlight(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	eps := newFakeEndpoints(
		podEndpoint(1, "c1", "tendril", now.Add(-time.Hour)),     // stale
		podEndpoint(2, "c2", "tendril", now.Add(-time.Second)),   // ADD just done
		podEndpoint(3, "c3", "tendril", now.Add(time.Second)),    // ADD during GC
		podEndpoint(4, "c4", "tendril", now.Add(-2*time.Minute)), // older than the grace
	)
	s := gcServer(t, eps, now)
	conf := `{"cniVersion":"1.1.0","name":"tendril","type":"tendril-cni","cni.dev/valid-attachments":[]}`
	if err := s.gc(context.Background(), gcRequest(conf)); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if eps.has(1) || eps.has(4) {
		t.Errorf("GC kept stale endpoints: 1 %v, 4 %v", eps.has(1), eps.has(4))
	}
	if !eps.has(2) || !eps.has(3) {
		t.Errorf("GC deleted an ADD in flight: 2 kept %v, 3 kept %v", eps.has(2), eps.has(3))
	}
}
