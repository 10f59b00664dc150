package lifecycle

import (
	"errors"
	"log/slog"
	"reflect"
	"testing"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
)

type first struct{}
type second struct{}

// TestInvokedRunsInTheCellsOrder: the root Invoke runs every module's
// Invoked constructor, in the order the modules are listed (not the order
// of their dependencies' construction), and a Check's error stops the
// population with the error as the check returned it.
func TestInvokedRunsInTheCellsOrder(t *testing.T) {
	var order []string
	errBad := errors.New("bad option")
	build := func(checkErr error) error {
		order = nil
		h := hive.New(
			cell.Module("mod-a", "First module",
				cell.Provide(func() *first { order = append(order, "construct a"); return &first{} }),
				cell.Provide(Build[*first]),
			),
			cell.Module("mod-b", "Second module",
				cell.Provide(Check(func(*second) error { order = append(order, "check b"); return checkErr })),
				cell.Provide(func() *second { order = append(order, "construct b"); return &second{} }),
			),
			cell.Invoke(func(in InvokedAll) {
				order = append(order, "root")
				if len(in.Values) != 2 {
					t.Errorf("the root Invoke took %d values, want 2", len(in.Values))
				}
			}),
		)
		return h.Populate(slog.New(slog.DiscardHandler))
	}
	if err := build(nil); err != nil {
		t.Fatal(err)
	}
	if want := []string{"construct a", "construct b", "check b", "root"}; !reflect.DeepEqual(order, want) {
		t.Fatalf("order %v, want %v", order, want)
	}
	err := build(errBad)
	if !errors.Is(err, errBad) {
		t.Fatalf("population error %v, want the check's", err)
	}
	if want := []string{"construct a", "construct b", "check b"}; !reflect.DeepEqual(order, want) {
		t.Fatalf("after a failed check: order %v, want %v", order, want)
	}
}
