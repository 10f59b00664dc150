package agentkv

import (
	"log/slog"
	"net/netip"
	"testing"

	"github.com/tendril-net/tendril/pkg/ipcache"
	"github.com/tendril-net/tendril/pkg/kvstore"
	"github.com/tendril-net/tendril/pkg/nodemanager"
)

// recordingIPCache keeps the claims the kvstore side makes.
type recordingIPCache struct {
	upserts map[netip.Addr]ipcache.Entry
	deletes []netip.Addr
}

func (r *recordingIPCache) UpsertRemoteEndpoint(ip netip.Addr, e ipcache.Entry) error {
	r.upserts[ip] = e
	return nil
}

func (r *recordingIPCache) DeleteRemoteEndpoint(ip netip.Addr, _ ipcache.Source, _ ipcache.Owner) error {
	r.deletes = append(r.deletes, ip)
	return nil
}

func (r *recordingIPCache) AddInitializer(string) func() { return func() {} }

// FuzzIPEvent: a kvstore ipcache key and value of any content (another
// node writes them) is decoded without a panic and reaches the ipcache
// only through the claim gate (TestClaimGate covers what the gate lets
// through): a write that bypasses it, or more than one claim per event,
// fails.
func FuzzIPEvent(f *testing.F) {
	f.Add("10.0.1.5", []byte(`{"IP":"10.0.1.5","ID":1234,"HostIP":"192.168.0.2","Node":"node-b","Namespace":"default","Name":"web"}`), false)
	f.Add("fd00::5", []byte(`{"IP":"fd00::5","ID":70000,"Node":"node-b"}`), false)
	f.Add("10.0.1.6", []byte(`{"IP":"10.0.1.6","ID":1234,"Node":"node-a"}`), false)
	f.Add("10.0.1.7", []byte(`{"IP":"10.0.1.7","ID":0,"Node":"node-b"}`), false)
	f.Add("10.0.1.8", []byte(`not json`), false)
	f.Add("10.0.1.5", []byte(nil), true)
	f.Add("10.0.1.0/24", []byte(`{"ID":5}`), false)
	f.Fuzz(func(t *testing.T, key string, value []byte, del bool) {
		rec := &recordingIPCache{upserts: map[netip.Addr]ipcache.Entry{}}
		log := slog.New(slog.DiscardHandler)
		// The claim gate before the nodes' listing: it judges only the
		// identity and writes nothing yet, so every claim the ipcache
		// sees below came from onIPEvent itself, past the gate (none
		// should).
		gate := nodemanager.NewClaimGate(nodemanager.ClaimGateParams{Cache: rec, Log: log})
		m := &Module{cfg: Config{NodeName: "node-a"}, log: log, ipcache: rec, gate: gate}
		typ := kvstore.EventCreate
		if del {
			typ = kvstore.EventDelete
		}
		m.onIPEvent(kvstore.Event{Type: typ, Key: key, Value: value})
		if len(rec.upserts) > 1 {
			t.Fatalf("one event made %d claims", len(rec.upserts))
		}
		for ip, e := range rec.upserts {
			want, err := netip.ParseAddr(key)
			if err != nil || ip != want {
				t.Fatalf("key %q claimed %s", key, ip)
			}
			if e.Identity == 0 || e.Owner != ipcache.OwnerKVStore(key) || e.Source != ipcache.SourceKVStore {
				t.Fatalf("claim %+v for key %q", e, key)
			}
			if del {
				t.Fatal("a delete made a claim")
			}
		}
	})
}
