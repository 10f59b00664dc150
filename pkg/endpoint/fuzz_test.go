package endpoint

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// FuzzLoadState: an endpoint state file of any content restores as the
// endpoint of its directory or is moved aside; it never panics the
// restore, never restores under another ID, and what restores writes back
// the same.
func FuzzLoadState(f *testing.F) {
	for _, s := range []string{
		`{"version":1,"endpoint":{"id":7,"container-id":"c1","interface-name":"eth0","cni-network":"tendril","host-interface-name":"tdr0123456789a","host-interface-index":12,"mac":"02:00:00:00:00:01","ipv4":"10.0.0.5","ipv6":"fd00::5","netns":"/run/netns/x","pod-namespace":"default","pod-name":"web","labels":["k8s:app=web"],"identity":1234,"state":"ready","created":"2026-11-28T12:00:00Z","regeneration":{"successes":1}}}`,
		`{"version":1,"endpoint":{"id":7,"state":"waiting-for-identity","created":"2026-11-28T12:00:00Z"}}`,
		`{"version":1,"endpoint":{"id":8}}`,
		`{"version":2,"endpoint":{"id":7}}`,
		`{"version":1}`,
		`{"version":1,"endpoint":{"id":7,"ipv4":"not an address"}}`,
		`{"version":1,"endpoint":{"id":7,"log":[{"time":"2026-11-28T12:00:00Z","state":"ready","message":"ok"}]}}`,
		``,
	} {
		f.Add([]byte(s))
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		// One store directory for the whole run: emptied per input.
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			_ = os.RemoveAll(filepath.Join(dir, e.Name()))
		}
		if err := os.MkdirAll(filepath.Join(dir, "7"), 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "7", "state.json"), data, 0o640); err != nil {
			t.Fatal(err)
		}
		s, err := NewStore(dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		eps, err := s.LoadAll()
		if err != nil {
			t.Fatalf("LoadAll: %v", err)
		}
		if len(eps) == 0 {
			if _, err := os.Stat(filepath.Join(dir, "7")); err == nil {
				t.Fatal("unreadable state neither restored nor moved aside")
			}
			return
		}
		if len(eps) != 1 || eps[0].ID != 7 {
			t.Fatalf("restored %d endpoints, first ID %d; want endpoint 7", len(eps), eps[0].ID)
		}
		// What restored encodes as the agent writes it, and that reads back
		// to the same.
		first, err := json.Marshal(onDisk{Version: stateVersion, Endpoint: eps[0]})
		if err != nil {
			t.Fatalf("restored endpoint does not encode: %v", err)
		}
		if err := os.WriteFile(filepath.Join(dir, "7", "state.json"), first, 0o640); err != nil {
			t.Fatal(err)
		}
		again, err := s.load("7")
		if err != nil {
			t.Fatalf("rewritten state %s does not load: %v", first, err)
		}
		second, _ := json.Marshal(onDisk{Version: stateVersion, Endpoint: again})
		if !bytes.Equal(first, second) {
			t.Fatalf("state changes on a round trip:\n%s\n%s", first, second)
		}
	})
}
