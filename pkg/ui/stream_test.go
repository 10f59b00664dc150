package ui

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// sseEvent is one Server-Sent Event of /api/stream.
type sseEvent struct {
	ID  string
	Msg StreamMessage
}

// openStream opens /api/stream?query, with a Last-Event-ID header when
// lastID is not empty (as EventSource reconnects). Its events arrive on
// the channel until the test ends; reading them has a generous deadline,
// so a stream that never sends fails the test rather than hanging it.
func openStream(t *testing.T, base, query, lastID string) <-chan sseEvent {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/stream?"+query, nil)
	if err != nil {
		t.Fatal(err)
	}
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream %s: %s", query, resp.Status)
	}
	out := make(chan sseEvent, 16)
	go func() {
		defer resp.Body.Close()
		defer close(out)
		rd := bufio.NewReader(resp.Body)
		var ev sseEvent
		for {
			l, err := rd.ReadString('\n')
			if err != nil {
				return
			}
			l = strings.TrimRight(l, "\n")
			switch {
			case strings.HasPrefix(l, "id: "):
				ev.ID = strings.TrimPrefix(l, "id: ")
			case strings.HasPrefix(l, "data: "):
				if err := json.Unmarshal([]byte(strings.TrimPrefix(l, "data: ")), &ev.Msg); err != nil {
					return
				}
			case l == "" && ev.Msg.Flows != nil:
				out <- ev
				ev = sseEvent{}
			}
		}
	}()
	return out
}

// nextEvent waits for the stream's next event.
func nextEvent(t *testing.T, events <-chan sseEvent, what string) sseEvent {
	t.Helper()
	select {
	case ev, ok := <-events:
		if !ok {
			t.Fatalf("%s: the stream ended", what)
		}
		return ev
	case <-time.After(15 * time.Second):
		t.Fatalf("%s: no stream message", what)
	}
	return sseEvent{}
}

// ports are the source ports of a message's flows.
func ports(m StreamMessage) string {
	var s []string
	for _, r := range m.Flows {
		s = append(s, fmt.Sprint(r.SourcePort))
	}
	return strings.Join(s, ",")
}

// TestStreamStartsWhereListEnded: the page lists the matching flows, then
// opens its live stream. A flow that arrives between the two must come in
// the stream (it once fell between them: the stream began at its own
// start), and none of the listed ones again. A reconnecting stream
// (EventSource sends the last event's id) resumes after what it was sent.
func TestStreamStartsWhereListEnded(t *testing.T) {
	demo, s, hs := uiOverDemo(t, Config{StreamBatch: 20 * time.Millisecond})
	demo.round(t, 0, 40000)
	eventually(t, "the first round in the UI", func() bool { return s.Store().Len() == 10 })

	var list struct {
		Flows  []Row  `json:"flows"`
		Cursor string `json:"cursor"`
	}
	getJSON(t, hs.URL+"/api/flows?verdict=DROPPED", &list)
	if len(list.Flows) != 2 {
		t.Fatalf("listed %d drops, want 2", len(list.Flows))
	}
	// A round between the list's answer and the stream's start.
	demo.round(t, time.Second, 40001)
	eventually(t, "the second round in the UI", func() bool { return s.Store().Len() == 20 })

	events := openStream(t, hs.URL, "verdict=DROPPED&after="+url.QueryEscape(list.Cursor), "")
	first := nextEvent(t, events, "the drops sent between the list and the stream")
	if got := ports(first.Msg); got != "40001,40001" || first.Msg.Skipped != 0 {
		t.Fatalf("first stream message: ports %s, skipped %d; want the second round's two drops (40001,40001)", got, first.Msg.Skipped)
	}
	demo.round(t, 2*time.Second, 40002)
	live := nextEvent(t, events, "the drops sent while streaming")
	if got := ports(live.Msg); got != "40002,40002" || live.ID == "" {
		t.Fatalf("live message: ports %s, id %q; want the third round's two drops, with an id", got, live.ID)
	}

	// A reconnection: the same URL (its after is the list's cursor), with
	// the last event's id, gets what came after that event only.
	demo.round(t, 3*time.Second, 40003)
	eventually(t, "the fourth round in the UI", func() bool { return s.Store().Len() == 40 })
	again := openStream(t, hs.URL, "verdict=DROPPED&after="+url.QueryEscape(list.Cursor), live.ID)
	if got := ports(nextEvent(t, again, "the reconnected stream").Msg); got != "40003,40003" {
		t.Fatalf("reconnected stream: ports %s, want only the fourth round's drops (40003,40003)", got)
	}

	// A cursor that is not one is refused; one of another UI process (an
	// EventSource reconnecting after a restart) starts at the live end.
	resp, err := http.Get(hs.URL + "/api/stream?after=yesterday")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("after=yesterday: %s, want 400", resp.Status)
	}
	other := openStream(t, hs.URL, "verdict=DROPPED", "0123456789abcdef-3")
	demo.round(t, 4*time.Second, 40004)
	if got := ports(nextEvent(t, other, "a stream with another process's cursor").Msg); got != "40004,40004" {
		t.Fatalf("stream with another process's cursor: ports %s, want the live round's drops only", got)
	}
}
