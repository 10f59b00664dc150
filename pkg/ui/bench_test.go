package ui

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// BenchmarkStreamFromRelay measures how many flows a second the UI takes
// in from a real Hubble server (flows/s) and delivers to one page's live
// stream (shown/s: rows sent, the rest counted as skipped): the demo's
// events are decoded into the server's observer in chunks of 10,000 (so
// its ring never laps the UI's reader), each chunk waited for in the UI.
// The decoding is part of the time; decode/s is its rate alone.
func BenchmarkStreamFromRelay(b *testing.B) {
	demo, s, hs := uiOverDemo(b, Config{Capacity: 100000})
	resp, err := http.Get(hs.URL + "/api/stream")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	shown, skipped := make(chan [2]int, 1024), 0
	go func() {
		rd := bufio.NewReaderSize(resp.Body, 1<<20)
		for {
			l, err := rd.ReadString('\n')
			if err != nil {
				close(shown)
				return
			}
			if data, ok := strings.CutPrefix(l, "data: "); ok {
				var m StreamMessage
				if json.Unmarshal([]byte(data), &m) == nil {
					shown <- [2]int{len(m.Flows), int(m.Skipped)}
				}
			}
		}
	}()
	const chunk = 10000 // 1,000 rounds of 10 flows
	evs := demoEvents(0, 40000)
	var decode time.Duration
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		for r := 0; r < chunk/len(evs); r++ {
			for _, ev := range evs {
				ev.Monotonic = time.Duration(i*chunk+r) * time.Microsecond
				if err := demo.obs.Observe(ev); err != nil {
					b.Fatal(err)
				}
			}
		}
		decode += time.Since(t0)
		want := uint64((i + 1) * chunk)
		for s.Store().Seen() < want {
			time.Sleep(100 * time.Microsecond)
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	// Let the stream send its last batch.
	time.Sleep(2 * DefaultStreamBatch)
	resp.Body.Close()
	rows := 0
	for c := range shown {
		rows += c[0]
		skipped += c[1]
	}
	total := float64(b.N * chunk)
	b.ReportMetric(total/elapsed.Seconds(), "flows/s")
	b.ReportMetric(total/decode.Seconds(), "decode/s")
	b.ReportMetric(float64(rows)/elapsed.Seconds(), "shown/s")
	b.ReportMetric(float64(rows+skipped)/total, "streamed-fraction")
}
