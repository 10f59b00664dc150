package agentl7

import (
	"log/slog"
	"reflect"
	"testing"

	"github.com/cilium/hive/cell"

	"github.com/tendril-net/tendril/pkg/agent/agentdatapath"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/lifecycle"
)

// TestProxiesOnlyWithTheDatapath: without the datapath (nothing would
// steer pod traffic to them) the cell adds no start step and runs no
// proxy; with it, its step comes where the cell list puts it.
func TestProxiesOnlyWithTheDatapath(t *testing.T) {
	for _, tc := range []struct {
		name string
		dp   *agentdatapath.Module
		want []string
	}{
		{"no datapath", nil, nil},
		{"datapath", &agentdatapath.Module{}, []string{"l7-proxies"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			steps := lifecycle.NewSteps(health.NewRegistry())
			lc := &recordedHooks{}
			register(params{Log: slog.New(slog.DiscardHandler), Lifecycle: lc, Steps: steps, Datapath: tc.dp})
			if got := steps.Names(); !reflect.DeepEqual(got, tc.want) || len(lc.hooks) != len(tc.want) {
				t.Fatalf("steps %v (%d hooks), want %v", got, len(lc.hooks), tc.want)
			}
		})
	}
}

// recordedHooks is a lifecycle that only records the hooks appended: the
// test looks at what the cell registers, not at the proxies' start
// (never started).
type recordedHooks struct {
	cell.DefaultLifecycle
	hooks []cell.HookInterface
}

func (r *recordedHooks) Append(h cell.HookInterface) { r.hooks = append(r.hooks, h) }
