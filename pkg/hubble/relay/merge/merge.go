// Package merge merges the GetFlows streams of several nodes into one
// stream ordered by time: each node sends its flows oldest first, so a
// k-way merge over their heads yields the cluster's flows in order
// without holding more than one response per node (and, for "the last N",
// the N newest).
package merge

import (
	"container/heap"
	"errors"
	"io"

	observerpb "github.com/cilium/cilium/api/v1/observer"
)

// Source is one node's stream; Recv returns io.EOF at its end.
type Source interface {
	Recv() (*observerpb.GetFlowsResponse, error)
}

// Options say which part of the merged stream to send.
type Options struct {
	// Number of responses: 0 sends all; otherwise the last Number, or
	// with First the first Number.
	Number uint64
	First  bool
	// OnError is told about a failing source (its index and error); the
	// merge continues with the others. nil ignores failures.
	OnError func(index int, err error)
}

type head struct {
	resp *observerpb.GetFlowsResponse
	src  int
}

type heads []head

func (h heads) Len() int { return len(h) }
func (h heads) Less(i, j int) bool {
	a, b := h[i].resp.GetTime(), h[j].resp.GetTime()
	if a.GetSeconds() != b.GetSeconds() {
		return a.GetSeconds() < b.GetSeconds()
	}
	if a.GetNanos() != b.GetNanos() {
		return a.GetNanos() < b.GetNanos()
	}
	return h[i].src < h[j].src // stable across nodes with equal times
}
func (h heads) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *heads) Push(x any)   { *h = append(*h, x.(head)) }
func (h *heads) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// Sorted sends the sources' responses in time order (as Options select)
// and returns when every source has ended, or send fails.
func Sorted(sources []Source, opts Options, send func(*observerpb.GetFlowsResponse) error) error {
	h := &heads{}
	next := func(i int) {
		r, err := sources[i].Recv()
		if err != nil {
			if !errors.Is(err, io.EOF) && opts.OnError != nil {
				opts.OnError(i, err)
			}
			return
		}
		heap.Push(h, head{resp: r, src: i})
	}
	for i := range sources {
		next(i)
	}
	// The last Number: a ring of the newest, sent at the end.
	var last []*observerpb.GetFlowsResponse
	keepLast := opts.Number > 0 && !opts.First
	start, sent := 0, uint64(0)
	for h.Len() > 0 {
		top := heap.Pop(h).(head)
		next(top.src)
		if keepLast {
			if uint64(len(last)) < opts.Number {
				last = append(last, top.resp)
			} else {
				last[start] = top.resp
				start = (start + 1) % len(last)
			}
			continue
		}
		if err := send(top.resp); err != nil {
			return err
		}
		sent++
		if opts.First && opts.Number > 0 && sent >= opts.Number {
			return nil
		}
	}
	for i := range last {
		if err := send(last[(start+i)%len(last)]); err != nil {
			return err
		}
	}
	return nil
}
