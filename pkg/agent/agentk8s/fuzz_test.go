package agentk8s

import (
	"encoding/json"
	"log/slog"
	"testing"

	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/k8s"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/k8s/watchers"
	"github.com/tendril-net/tendril/pkg/policy"
)

// FuzzTendrilEndpoint: a TendrilEndpoint of any content (another node's
// agent writes it) gives the policy universe only named ports it really
// holds: under its identity, each with the port number and protocol of one
// of its named ports; and its delete takes them all back.
func FuzzTendrilEndpoint(f *testing.F) {
	f.Add([]byte(`{"metadata":{"name":"db","namespace":"x"},"status":{"identity":{"id":4242},"networking":{"node":"192.168.0.2","addressing":[{"ipv4":"10.0.1.5","ipv6":"fd00:1::5"}]},"named-ports":[{"name":"sql","port":5432,"protocol":"TCP"},{"name":"dns","port":53,"protocol":"UDP"}]}}`))
	f.Add([]byte(`{"metadata":{"name":"web","namespace":"x"},"status":{"identity":{"id":4243},"named-ports":[{"name":"http","port":8080},{"name":"s","port":9,"protocol":"SCTP"}]}}`))
	f.Add([]byte(`{"metadata":{"name":"odd","namespace":"x"},"status":{"identity":{"id":1},"named-ports":[{"name":"big","port":70000,"protocol":"ICMP"}]}}`))
	f.Add([]byte(`{"status":{}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var tep v1alpha1.TendrilEndpoint
		if json.Unmarshal(data, &tep) != nil {
			return
		}
		k := &Module{policy: &triggerCounter{}, client: &Client{}, log: slog.New(slog.DiscardHandler)}
		key := tep.Namespace + "/" + tep.Name
		k.recordRemotePorts(watchers.Event[*k8s.CachedEndpoint]{Kind: watchers.Upsert, Key: key, Object: k8s.NewCachedEndpoint(&tep)})
		out := map[identity.NumericIdentity]map[string]policy.NamedPort{}
		k.client.AddRemoteNamedPorts(out)
		protos := map[string]uint8{"": 6, "TCP": 6, "UDP": 17, "SCTP": 132}
		for id, ports := range out {
			if tep.Status.Identity == nil || id != identity.NumericIdentity(tep.Status.Identity.ID) {
				t.Fatalf("named ports under identity %d", id)
			}
			for name, np := range ports {
				found := false
				for _, in := range tep.Status.NamedPorts {
					p, ok := protos[in.Protocol]
					found = found || (in.Name == name && ok && in.Port == int32(np.Port) && p == np.Proto)
				}
				if !found || np.Port == 0 {
					t.Fatalf("named port %s = %+v is none of %+v", name, np, tep.Status.NamedPorts)
				}
			}
		}
		k.recordRemotePorts(watchers.Event[*k8s.CachedEndpoint]{Kind: watchers.Delete, Key: key, Object: k8s.NewCachedEndpoint(&tep)})
		out = map[identity.NumericIdentity]map[string]policy.NamedPort{}
		k.client.AddRemoteNamedPorts(out)
		if len(out) != 0 {
			t.Fatalf("after the delete: %v", out)
		}
	})
}
