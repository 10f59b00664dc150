package merge

import (
	"errors"
	"io"
	"slices"
	"testing"
	"time"

	observerpb "github.com/cilium/cilium/api/v1/observer"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// fakeSource returns responses at the given ms, then err (io.EOF when nil).
type fakeSource struct {
	ms  []int
	err error
}

var t0 = time.Unix(1_800_000_000, 0)

func (f *fakeSource) Recv() (*observerpb.GetFlowsResponse, error) {
	if len(f.ms) == 0 {
		if f.err != nil {
			return nil, f.err
		}
		return nil, io.EOF
	}
	ms := f.ms[0]
	f.ms = f.ms[1:]
	return &observerpb.GetFlowsResponse{Time: timestamppb.New(t0.Add(time.Duration(ms) * time.Millisecond))}, nil
}

func run(t *testing.T, opts Options, srcs ...*fakeSource) []int {
	t.Helper()
	var in []Source
	for _, s := range srcs {
		in = append(in, s)
	}
	var got []int
	err := Sorted(in, opts, func(r *observerpb.GetFlowsResponse) error {
		got = append(got, int(r.GetTime().AsTime().Sub(t0)/time.Millisecond))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestSorted: the merge of ordered sources is ordered, cut to the first or
// last N, and a failing source is reported while the others go on.
func TestSorted(t *testing.T) {
	src := func() []*fakeSource {
		return []*fakeSource{{ms: []int{1, 5, 9}}, {ms: []int{2, 3, 10}}, {ms: nil}, {ms: []int{4, 6, 7, 8}}}
	}
	if got := run(t, Options{}, src()...); !slices.Equal(got, []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}) {
		t.Errorf("all: %v", got)
	}
	if got := run(t, Options{Number: 4}, src()...); !slices.Equal(got, []int{7, 8, 9, 10}) {
		t.Errorf("last 4: %v", got)
	}
	if got := run(t, Options{Number: 20}, src()...); len(got) != 10 {
		t.Errorf("last 20 of 10: %v", got)
	}
	if got := run(t, Options{Number: 3, First: true}, src()...); !slices.Equal(got, []int{1, 2, 3}) {
		t.Errorf("first 3: %v", got)
	}
	var failed []int
	broken := errors.New("node went away")
	got := run(t, Options{OnError: func(i int, err error) {
		if errors.Is(err, broken) {
			failed = append(failed, i)
		}
	}}, &fakeSource{ms: []int{1, 3}, err: broken}, &fakeSource{ms: []int{2, 4, 6}})
	if !slices.Equal(got, []int{1, 2, 3, 4, 6}) || !slices.Equal(failed, []int{0}) {
		t.Errorf("with a failing source: %v, failed %v", got, failed)
	}
}
