package soak

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// Markdown writes the result as the bench prints it (and
// docs/benchmarks.md records it).
func (r *Result) Markdown(w io.Writer) {
	c := r.Churn
	verdict := "PASS"
	if !r.Passed() {
		verdict = "FAIL"
	}
	fmt.Fprintf(w, "## Soak: %s\n\n", verdict)
	rate := 0.0
	if c.Elapsed > 0 {
		rate = float64(c.Created) / c.Elapsed.Seconds()
	}
	fmt.Fprintf(w, "- lab %s, %d nodes; churn %s at %g pods/s asked (%.2f/s created): %d created, %d ready, %d deleted, %d failed\n",
		r.Config.Lab.Name, len(r.Config.Lab.Nodes), c.Elapsed.Round(time.Second), r.Config.Rate, rate, c.Created, c.Ready, c.Deleted, c.Failed)
	fmt.Fprintf(w, "- traffic: %d pods reached the server on the other node (%d probes each), %d never did; denied port: %d unanswered, %d answered\n",
		c.AllowedOK, r.Config.Probes, c.AllowedFailed, c.DeniedOK, c.DeniedAnswered)
	if c.FirstError != "" {
		fmt.Fprintf(w, "- first error: %s\n", c.FirstError)
	}
	fmt.Fprintf(w, "- counts settled %s after the last pod was gone\n\n", r.SettledIn.Round(time.Second))
	fmt.Fprintln(w, "| node | what | before | after | leaked | allowance | examples |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---|")
	for _, l := range r.Leaks {
		node := l.Node
		if node == "" {
			node = "cluster"
		}
		mark := ""
		if l.Leaked() {
			mark = " **LEAK**"
		}
		fmt.Fprintf(w, "| %s | %s | %d | %d | %d%s | ±%d | %s |\n", node, l.What, l.Before, l.After, l.N, mark, l.Allowance,
			strings.ReplaceAll(strings.Join(l.Examples, "; "), "|", "\\|"))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| agent | RSS samples | first MiB | last MiB | max MiB | slope KiB/min | ± stderr | second half KiB/min | ± stderr | flat (second half) |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
	for _, m := range r.Memory {
		if m.Err != "" {
			fmt.Fprintf(w, "| %s | %d | | | | | | | | %s |\n", m.Node, m.Samples, m.Err)
			continue
		}
		fmt.Fprintf(w, "| %s | %d | %.1f | %.1f | %.1f | %+.1f | %.1f | %+.1f | %.1f | %v |\n", m.Node, m.Samples,
			float64(m.First)/1024, float64(m.Last)/1024, float64(m.Max)/1024, m.KiBPerMin, m.StdErr, m.LateKiBPerMin, m.LateStdErr, m.Flat())
	}
	fmt.Fprintln(w)
	// The second half's RSS slope split into its parts: RssAnon is what
	// a leak grows; RssFile is the binary's own pages mapped back.
	fmt.Fprintln(w, "| agent | RssAnon last MiB | RssAnon second half KiB/min | ± stderr | anon flat | RssFile last MiB | RssFile second half KiB/min | ± stderr |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---|---:|---:|---:|")
	for _, m := range r.Memory {
		if m.Err != "" {
			continue
		}
		fmt.Fprintf(w, "| %s | %.1f | %+.1f | %.1f | %v | %.1f | %+.1f | %.1f |\n", m.Node, float64(m.LastAnon)/1024,
			m.AnonLateKiBPerMin, m.AnonLateStdErr, m.AnonFlat(), float64(m.LastFile)/1024, m.FileLateKiBPerMin, m.FileLateStdErr)
	}
	r.cpuMarkdown(w)
}

// cpuMarkdown writes the churn's CPU by process group, and the rate the
// lab could reach with Tendril's share of it made free when the CPUs
// were the bound.
func (r *Result) cpuMarkdown(w io.Writer) {
	u := r.CPU
	capacity := float64(u.CPUs) * u.Elapsed
	if u.Err != "" || capacity <= 0 || u.Busy <= 0 {
		fmt.Fprintf(w, "\nCPU over the churn: not measured %s\n", u.Err)
		return
	}
	pct := func(s float64) float64 { return 100 * s / capacity }
	tendril := u.TendrilSeconds()
	fmt.Fprintf(w, "\nCPU over the churn: %d CPUs × %.0f s, busy %.0f s (%.1f %%); the processes seen at the samples %.0f s, the rest (processes that lived between two samples, the kernel's packet work) %.0f s.\n\n",
		u.CPUs, u.Elapsed, u.Busy, pct(u.Busy), u.Attributed(), u.Busy-u.Attributed())
	fmt.Fprintln(w, "| processes | CPU s | % of the CPUs | Tendril's |")
	fmt.Fprintln(w, "|---|---:|---:|---|")
	shown := 0.0
	for i, g := range u.Groups {
		if i >= 12 {
			fmt.Fprintf(w, "| %d others | %.1f | %.1f | |\n", len(u.Groups)-i, u.Attributed()-shown, pct(u.Attributed()-shown))
			break
		}
		shown += g.Seconds
		mark := ""
		if g.Tendril {
			mark = "yes"
		}
		fmt.Fprintf(w, "| %s | %.1f | %.1f | %s |\n", g.Group, g.Seconds, pct(g.Seconds), mark)
	}
	c := r.Churn
	if c.Elapsed <= 0 || tendril >= u.Busy {
		return
	}
	rate := float64(c.Created) / c.Elapsed.Seconds()
	fmt.Fprintf(w, "\nTendril's own processes took %.1f %% of the busy time. ", 100*tendril/u.Busy)
	if u.Busy < 0.9*capacity {
		fmt.Fprintf(w, "The CPUs were not the bound (busy %.0f %%).\n", pct(u.Busy))
		return
	}
	// CPU per pod is what bounds the rate: without Tendril's share each
	// pod costs (busy - Tendril's) / created, and the CPUs hold capacity.
	fmt.Fprintf(w, "The CPUs were the bound: with that share free the same lab would churn at most %.2f pods/s (%.2f × %.0f CPU s / %.0f), this machine's floor for the harness.\n",
		rate*capacity/(u.Busy-tendril), rate, capacity, u.Busy-tendril)
}
