package endpoint

import (
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/cilium/api/v1/models"
)

func TestStateMachine(t *testing.T) {
	now := time.Unix(0, 0)
	tests := []struct {
		path    []State
		wantErr bool
	}{
		{[]State{StateWaitingForIdentity, StateWaitingToRegenerate, StateRegenerating, StateReady}, false},
		{[]State{StateRestoring, StateRegenerating, StateReady, StateDisconnecting, StateDisconnected}, false},
		{[]State{StateWaitingForIdentity, StateReady}, true},
		{[]State{StateRestoring, StateReady}, true},
		{[]State{StateWaitingForIdentity, StateDisconnecting, StateDisconnected, StateReady}, true},
		{[]State{StateWaitingForIdentity, StateInvalid, StateReady}, true},
	}
	for _, tt := range tests {
		ep := &Endpoint{ID: 1}
		var err error
		for _, s := range tt.path {
			if err = ep.SetState(s, "step", now); err != nil {
				break
			}
		}
		if (err != nil) != tt.wantErr {
			t.Errorf("path %v: err %v, wantErr %v", tt.path, err, tt.wantErr)
		}
	}
}

func TestLogIsBounded(t *testing.T) {
	ep := &Endpoint{ID: 1}
	_ = ep.SetState(StateWaitingForIdentity, "created", time.Now())
	for i := 0; i < 100; i++ {
		ep.LogFailure("again", time.Now())
	}
	if len(ep.Log) != maxLogEntries {
		t.Fatalf("log has %d entries", len(ep.Log))
	}
}

func TestStoreAtomicAndCorrupt(t *testing.T) {
	dir := t.TempDir()
	s, err := NewStore(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		ep := &Endpoint{ID: uint16(i), IPv4: netip.MustParseAddr("10.0.0." + string(rune('1'+i))), State: StateReady}
		if err := s.Write(ep); err != nil {
			t.Fatal(err)
		}
	}
	// Corrupt endpoint 2.
	if err := os.WriteFile(filepath.Join(dir, "2", "state.json"), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	eps, err := s.LoadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(eps) != 2 || eps[0].ID != 1 || eps[1].ID != 3 {
		t.Fatalf("loaded %+v", eps)
	}
	entries, _ := os.ReadDir(dir)
	moved := false
	for _, e := range entries {
		moved = moved || strings.HasPrefix(e.Name(), "2.corrupt-")
		if strings.Contains(e.Name(), ".tmp-") {
			t.Fatalf("temp file left: %s", e.Name())
		}
	}
	if !moved {
		t.Fatal("corrupt state not moved aside")
	}
	// Loading again does not trip over the moved-aside directory.
	if eps, _ := s.LoadAll(); len(eps) != 2 {
		t.Fatalf("second load: %d", len(eps))
	}
	if err := s.Remove(3); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "3")); !os.IsNotExist(err) {
		t.Fatal("removed endpoint dir still there")
	}
}

func TestFromChangeRequest(t *testing.T) {
	tests := []struct {
		name    string
		req     *models.EndpointChangeRequest
		wantErr string
	}{
		{"ok", &models.EndpointChangeRequest{ContainerID: "c1", Addressing: &models.AddressPair{IPV4: "10.0.0.5"}, K8sNamespace: "ns", K8sPodName: "p"}, ""},
		{"no address", &models.EndpointChangeRequest{ContainerID: "c1"}, "no address"},
		{"bad v4", &models.EndpointChangeRequest{Addressing: &models.AddressPair{IPV4: "fd00::1"}}, "not an IPv4"},
		{"half pod", &models.EndpointChangeRequest{Addressing: &models.AddressPair{IPV4: "10.0.0.5"}, K8sPodName: "p"}, "together"},
		{"nil", nil, "empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ep, err := FromChangeRequest(tt.req)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				m := ep.Model(nil)
				if m.Status.ExternalIdentifiers.PodName != "ns/p" || m.Status.ExternalIdentifiers.CniAttachmentID != "c1:eth0" {
					t.Fatalf("model ids = %+v", m.Status.ExternalIdentifiers)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

// TestStoreConcurrentWrites: writes of many endpoints at once (committed in
// shared batches) all land, each endpoint's last write wins, the ID cursor
// file among them, and no temp file is left.
func TestStoreConcurrentWrites(t *testing.T) {
	dir := t.TempDir()
	s, err := NewStore(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	const n = 40
	var wg sync.WaitGroup
	errs := make(chan error, 3*n)
	for i := 1; i <= n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Two writes of one endpoint, in order: the second must win.
			for _, st := range []State{StateWaitingForIdentity, StateReady} {
				errs <- s.Write(&Endpoint{ID: uint16(i), State: st, IPv4: netip.AddrFrom4([4]byte{10, 0, 1, byte(i)})})
			}
			errs <- s.WriteFile("next-id", []byte(strconv.Itoa(i)))
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	eps, err := s.LoadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(eps) != n {
		t.Fatalf("%d endpoints on disk, want %d", len(eps), n)
	}
	for _, ep := range eps {
		if ep.State != StateReady || ep.IPv4 != netip.AddrFrom4([4]byte{10, 0, 1, byte(ep.ID)}) {
			t.Errorf("endpoint %d on disk: %s %s, want its last write", ep.ID, ep.State, ep.IPv4)
		}
	}
	if data, err := s.ReadFile("next-id"); err != nil || len(data) == 0 {
		t.Errorf("next-id: %q %v", data, err)
	}
	_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && strings.Contains(d.Name(), ".tmp-") {
			t.Errorf("temp file left: %s", path)
		}
		return nil
	})
}

// TestStoreWriteError: a write that cannot happen reports its error to its
// writer, and the other writes of the batch still land.
func TestStoreWriteError(t *testing.T) {
	dir := t.TempDir()
	s, err := NewStore(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A file where endpoint 7's directory would be.
	if err := os.WriteFile(filepath.Join(dir, "7"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var bad, good error
	wg.Add(2)
	go func() { defer wg.Done(); bad = s.Write(&Endpoint{ID: 7}) }()
	go func() { defer wg.Done(); good = s.Write(&Endpoint{ID: 8}) }()
	wg.Wait()
	if bad == nil {
		t.Error("write into a file succeeded")
	}
	if good != nil {
		t.Errorf("the other write failed too: %v", good)
	}
}
