package ui

import (
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tendril-net/tendril/pkg/ui/uitest"
)

// BenchmarkBrowserFollow measures whether the page in Chromium keeps up
// with 10,000 flows a second: a real Hubble server is fed the demo's
// events at that pace (1,000 every 100 ms; b.N seconds), the UI reads them,
// and the page follows the unfiltered table of the demo namespace. It
// reports the pace reached (fed/s, below 10,000 when decoding the events
// cannot keep it), intake-lag-ms (from the last flow fed until the UI had
// read it), page-lag-ms (until the page had accounted for every flow that
// came after its list, shown or counted as skipped: at most 500 rows per
// stream message) and page-behind-intake-ms, their difference: the page's
// own share. A page that fell behind the stream would make that grow with
// b.N; accounted-fraction says whether its count is whole.
func BenchmarkBrowserFollow(b *testing.B) {
	ctx := uitest.Browser(b)
	// The store holds every flow of the run (the 40,000 first ones and
	// 10,000 a second): the count the page must reach is read from it.
	demo, s, hs := uiOverDemo(b, Config{Capacity: max(200000, 50000+b.N*10000)})
	demo.round(b, 0, 40000)
	for s.Store().Seen() < 10 {
		time.Sleep(10 * time.Millisecond)
	}
	uitest.Do(b, ctx, "the page following the flow table",
		chromedp.Navigate(hs.URL+"?namespace=demo"),
		chromedp.Click(`nav button[data-tab="flows"]`),
		uitest.Poll(`document.querySelector('#flows-info').dataset.listed !== undefined`),
	)
	listed := uitest.Value(b, ctx, "the listed count", chromedp.Evaluate[string](`document.querySelector('#flows-info').dataset.listed`))
	evs := demoEvents(0, 40000)
	const chunk, tick = 1000, 100 * time.Millisecond
	fed := 0
	b.ResetTimer()
	start := time.Now()
	next := start
	for i := 0; i < b.N*10; i++ {
		for r := 0; r < chunk/len(evs); r++ {
			for _, ev := range evs {
				ev.Monotonic = time.Second + time.Duration(fed)*time.Microsecond
				if err := demo.obs.Observe(ev); err != nil {
					b.Fatal(err)
				}
				fed++
			}
		}
		next = next.Add(tick)
		time.Sleep(time.Until(next))
	}
	end := time.Now()
	for s.Store().Seen() < uint64(10+fed) {
		time.Sleep(time.Millisecond)
	}
	intake := time.Since(end)
	var fl FlowList
	getJSON(b, hs.URL+"/api/flows?namespace=demo&limit=1", &fl)
	n, err := strconv.Atoi(listed)
	if err != nil {
		b.Fatalf("listed %q", listed)
	}
	want := fl.Matched - n
	var followed int
	for {
		got := uitest.Value(b, ctx, "the page's count", chromedp.Evaluate[string](`document.querySelector('#flows-info').dataset.followed`))
		if followed, err = strconv.Atoi(got); err != nil {
			b.Fatalf("followed %q", got)
		}
		if followed >= want || time.Since(end) > 2*time.Minute {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	lag := time.Since(end)
	b.StopTimer()
	rows := uitest.Value(b, ctx, "rows", chromedp.Evaluate[int](`document.querySelectorAll('#flows tbody tr.flow').length`))
	b.ReportMetric(float64(fed)/end.Sub(start).Seconds(), "fed/s")
	b.ReportMetric(float64(lag.Milliseconds()), "page-lag-ms")
	b.ReportMetric(float64(intake.Milliseconds()), "intake-lag-ms")
	// The page's own share: how long after the UI had every flow the page
	// had accounted for them.
	b.ReportMetric(float64((lag - intake).Milliseconds()), "page-behind-intake-ms")
	b.ReportMetric(float64(followed)/float64(want), "accounted-fraction")
	b.Logf("fed %d flows in %s; the page accounted for %d of the %d matching after its list, %s after the last (UI intake %s after); %d rows on the page",
		fed, end.Sub(start).Round(time.Millisecond), followed, want, lag.Round(time.Millisecond), intake.Round(time.Millisecond), rows)
	if followed != want {
		b.Errorf("the page accounted for %d flows, want %d", followed, want)
	}
}
