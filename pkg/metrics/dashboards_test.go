package metrics

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// exportedMetrics are the metric names the components can export, read
// from the code: the series of the registry New makes (the Go and process
// collectors every component's registry holds), and every metric the
// source defines with prometheus.{Counter,Gauge,Histogram,Summary}Opts or
// prometheus.NewDesc (with a histogram's _bucket, _sum and _count series).
// A definition whose name is not a string literal fails the test: it
// could not be checked.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	fams, err := New(DefaultConfig(), nil).Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		out[f.GetName()] = true
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			out[f.GetName()+suffix] = true
		}
	}
	fset := token.NewFileSet()
	lit := func(e ast.Expr) (string, bool) {
		b, ok := e.(*ast.BasicLit)
		if !ok || b.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(b.Value)
		return s, err == nil
	}
	isProm := func(e ast.Expr, names ...string) (string, bool) {
		sel, ok := e.(*ast.SelectorExpr)
		if !ok {
			return "", false
		}
		pkg, ok := sel.X.(*ast.Ident)
		if !ok || pkg.Name != "prometheus" || !slices.Contains(names, sel.Sel.Name) {
			return "", false
		}
		return sel.Sel.Name, true
	}
	for _, dir := range []string{"../../pkg", "../../cmd"} {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
			}
			ast.Inspect(f, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.CompositeLit:
					kind, ok := isProm(n.Type, "CounterOpts", "GaugeOpts", "HistogramOpts", "SummaryOpts", "Opts")
					if !ok {
						return true
					}
					parts := map[string]string{}
					for _, el := range n.Elts {
						kv, ok := el.(*ast.KeyValueExpr)
						if !ok {
							continue
						}
						key := kv.Key.(*ast.Ident).Name
						if key != "Namespace" && key != "Subsystem" && key != "Name" {
							continue
						}
						v, ok := lit(kv.Value)
						if !ok {
							t.Errorf("%s: the metric's %s is not a string literal: cannot check dashboards against it", fset.Position(kv.Pos()), key)
						}
						parts[key] = v
					}
					var name []string
					for _, k := range []string{"Namespace", "Subsystem", "Name"} {
						if parts[k] != "" {
							name = append(name, parts[k])
						}
					}
					full := strings.Join(name, "_")
					out[full] = true
					if kind == "HistogramOpts" || kind == "SummaryOpts" {
						out[full+"_sum"], out[full+"_count"] = true, true
					}
					if kind == "HistogramOpts" {
						out[full+"_bucket"] = true
					}
				case *ast.CallExpr:
					if _, ok := isProm(n.Fun, "NewDesc"); !ok || len(n.Args) == 0 {
						return true
					}
					v, ok := lit(n.Args[0])
					if !ok {
						t.Errorf("%s: prometheus.NewDesc's name is not a string literal", fset.Position(n.Pos()))
					}
					out[v] = true
				}
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

var (
	promString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promMatchers = regexp.MustCompile(`\{[^}]*\}`)
	promRange    = regexp.MustCompile(`\[[^\]]*\]`)
	promNumber   = regexp.MustCompile(`(^|[^a-zA-Z0-9_:])[0-9][0-9a-zA-Z.]*`)
	promGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promIdent    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
	promKeywords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
		"bool": true, "and": true, "or": true, "unless": true, "offset": true, "inf": true, "nan": true}
)

// queryMetrics are the metric names a PromQL expression reads: its
// identifiers that are not functions, aggregations, keywords, label names
// (in matchers and grouping), numbers or durations.
func queryMetrics(expr string) []string {
	e := promString.ReplaceAllString(expr, `""`)
	e = promMatchers.ReplaceAllString(e, "")
	e = promRange.ReplaceAllString(e, "")
	e = promGrouping.ReplaceAllString(e, "")
	e = promNumber.ReplaceAllString(e, "$1")
	var out []string
	for _, m := range promIdent.FindAllStringSubmatch(e, -1) {
		if m[1] != "" || promKeywords[strings.ToLower(m[0])] {
			continue // a function or aggregation call, or a keyword
		}
		out = append(out, m[0])
	}
	return out
}

func TestQueryMetrics(t *testing.T) {
	got := queryMetrics(`histogram_quantile(0.95, sum by (le, service) (rate(a_bucket{job="x", le!="+Inf"}[5m]))) / on (service) b_total offset 5m`)
	if strings.Join(got, ",") != "a_bucket,b_total" {
		t.Errorf("metrics of the expression: %v", got)
	}
}

// TestGrafanaDashboardsQueryExportedMetrics checks every query of the
// dashboards under install/grafana names only metrics the components
// export.
func TestGrafanaDashboardsQueryExportedMetrics(t *testing.T) {
	exported := exportedMetrics(t)
	// The scan must find the metrics the dashboards lean on, or it
	// checks nothing.
	for _, m := range []string{"tendril_datapath_packets_total", "tendril_hubble_tcp_connect_rtt_seconds_bucket", "tendril_operator_is_leader", "process_resident_memory_bytes"} {
		if !exported[m] {
			t.Fatalf("the scan of the code did not find %s", m)
		}
	}
	if exported["tendril_no_such_metric_total"] {
		t.Fatal("the scan finds a metric nobody defines")
	}
	files, err := filepath.Glob("../../install/grafana/*.json")
	if err != nil || len(files) < 3 {
		t.Fatalf("dashboards: %v %v", files, err)
	}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var d struct {
			UID    string
			Title  string
			Panels []struct {
				Title   string
				Targets []struct{ Expr string }
			}
		}
		if err := json.Unmarshal(data, &d); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if d.UID == "" || len(d.Panels) == 0 {
			t.Errorf("%s: no uid or no panels", file)
		}
		for _, p := range d.Panels {
			if len(p.Targets) == 0 {
				t.Errorf("%s: panel %q has no query", file, p.Title)
			}
			for _, q := range p.Targets {
				names := queryMetrics(q.Expr)
				if len(names) == 0 {
					t.Errorf("%s: panel %q: %q reads no metric", file, p.Title, q.Expr)
				}
				for _, n := range names {
					if !exported[n] {
						t.Errorf("%s: panel %q: %q reads %s, which no component exports", file, p.Title, q.Expr, n)
					}
				}
			}
		}
	}
}
