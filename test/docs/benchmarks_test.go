package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// testFuncs lists the Test and Benchmark functions of the tree's test
// files by directory.
func testFuncs(files []goFile) map[string][]string {
	out := map[string][]string{}
	for _, f := range files {
		if !f.test {
			continue
		}
		for _, d := range f.ast.Decls {
			if fd, ok := funcDeclName(d); ok && (strings.HasPrefix(fd, "Test") || strings.HasPrefix(fd, "Benchmark")) {
				out[f.dir] = append(out[f.dir], fd)
			}
		}
	}
	return out
}

var (
	// A test or benchmark named in the text.
	funcName = regexp.MustCompile(`\b(?:Test|Benchmark)[A-Z][A-Za-z0-9_]*`)
	// A command in backticks (it may wrap across lines).
	backtickSpan = regexp.MustCompile("`([^`]+)`")
	// A -bench or -run pattern, bare or quoted; a markdown table escapes
	// its | as \|.
	patternFlag = regexp.MustCompile(`-(bench|run)[ =]('[^']*'|"[^"]*"|\S+)`)
	// A path into the tree.
	treePath = regexp.MustCompile(`(?:\./)?\b(?:pkg|bench|test|cmd|hack|api|deploy|examples)/[A-Za-z0-9_./{}-]*[A-Za-z0-9_]`)
)

// benchmarkDocs are the files whose numbers must come from commands of the
// tree.
var benchmarkDocs = []string{"docs/benchmarks.md", "docs/benchmarks/cni.md", "docs/benchmarks/datapath.md"}

// TestBenchmarkDocNamesExist: every test and benchmark docs/benchmarks*.md
// names is a function of the tree, every -bench/-run pattern of a `go test`
// command there matches one in its packages, and every path it names
// exists.
func TestBenchmarkDocNamesExist(t *testing.T) {
	root := repoRoot(t)
	funcs := testFuncs(parseTree(t))
	all := map[string]bool{}
	for _, names := range funcs {
		for _, n := range names {
			all[n] = true
		}
	}
	if !all["TestBenchmarkDocNamesExist"] {
		t.Fatal("the tree's test functions were not found: the scan is broken")
	}
	for _, doc := range benchmarkDocs {
		text := strings.ReplaceAll(readDoc(t, doc), `\|`, "|")
		for _, loc := range funcName.FindAllStringIndex(text, -1) {
			name := text[loc[0]:loc[1]]
			if loc[1] < len(text) && strings.ContainsRune("(|.*[", rune(text[loc[1]])) {
				continue // part of a -run or -bench pattern: checked below
			}
			if !all[name] {
				t.Errorf("%s names %s, which is no test or benchmark of the tree", doc, name)
				all[name] = true // once
			}
		}
		for _, p := range uniq(treePath.FindAllString(text, -1)) {
			p = strings.TrimPrefix(p, "./")
			if strings.Contains(p, "{") {
				continue // a pattern such as bench/{a,b}: not one path
			}
			if _, err := os.Stat(filepath.Join(root, strings.TrimSuffix(p, "/..."))); err != nil {
				t.Errorf("%s names %s, which does not exist", doc, p)
			}
		}
		for _, m := range backtickSpan.FindAllStringSubmatch(text, -1) {
			if patternFlag.MatchString(m[1]) {
				checkGoTestPatterns(t, doc, m[1], funcs)
			}
		}
	}
	checkSummarySources(t, readDoc(t, "docs/benchmarks.md"))
}

// aCommand is what a summary row's "how" cell must hold: a command of the
// tree (a go test/go run line, a -bench pattern, a bench/ script, a named
// test or benchmark).
var aCommand = regexp.MustCompile(`go test|go run|-bench |bench/[a-z0-9]+/run\.sh|\b(Test|Benchmark)[A-Z]`)

// checkSummarySources: each row of the Summary table names the command
// its numbers come from in its last cell.
func checkSummarySources(t *testing.T, doc string) {
	t.Helper()
	_, rest, ok := strings.Cut(doc, "## Summary\n")
	if !ok {
		t.Fatal("docs/benchmarks.md has no Summary section")
	}
	section, _, _ := strings.Cut(rest, "\n## ")
	rows := 0
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| what |") {
			continue
		}
		// A cell's own | is written \|.
		line = strings.ReplaceAll(line, `\|`, "\x00")
		cells := strings.Split(strings.TrimSuffix(strings.TrimSpace(line), "|"), "|")
		how := cells[len(cells)-1]
		rows++
		if !aCommand.MatchString(how) {
			t.Errorf("docs/benchmarks.md Summary row %q: its source %q names no command of the tree", strings.TrimSpace(cells[1]), strings.TrimSpace(how))
		}
	}
	if rows == 0 {
		t.Fatal("docs/benchmarks.md: no Summary rows found")
	}
}

// checkGoTestPatterns checks that each -bench and -run pattern of cmd
// matches a function in the packages cmd names (or anywhere, without one).
func checkGoTestPatterns(t *testing.T, doc, cmd string, funcs map[string][]string) {
	t.Helper()
	var dirs []string
	for _, f := range strings.Fields(cmd) {
		if strings.HasPrefix(f, "./") {
			dirs = append(dirs, strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(f, "./"), "/..."), "/"))
		}
	}
	for _, m := range patternFlag.FindAllStringSubmatch(cmd, -1) {
		kind, pat := m[1], strings.Trim(m[2], `'"`)
		// go test matches a pattern's first /-separated part against
		// the top-level functions, the rest against sub-benchmarks.
		pat, _, _ = strings.Cut(pat, "/")
		if pat == "^$" || pat == "." {
			continue
		}
		re, err := regexp.Compile(pat)
		if err != nil {
			t.Errorf("%s: `%s`: -%s %q: %v", doc, cmd, kind, pat, err)
			continue
		}
		prefix := "Benchmark"
		if kind == "run" {
			prefix = "Test"
		}
		found := false
		for dir, names := range funcs {
			if len(dirs) > 0 && !underAny(dir, dirs) {
				continue
			}
			for _, n := range names {
				if strings.HasPrefix(n, prefix) && re.MatchString(n) {
					found = true
				}
			}
		}
		if !found {
			t.Errorf("%s: `%s`: -%s %q matches no %s function in %v", doc, cmd, kind, pat, prefix, dirs)
		}
	}
}

func underAny(dir string, roots []string) bool {
	for _, r := range roots {
		r = filepath.FromSlash(r)
		if dir == r || strings.HasPrefix(dir, r+string(filepath.Separator)) {
			return true
		}
	}
	return false
}

func uniq(in []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range in {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}
