package docs_test

import (
	"go/ast"
	"go/token"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

const modulePath = "github.com/tendril-net/tendril/"

// stringConsts maps "dir.Name" to the value of every string constant
// declared in the tree's non-test files.
func stringConsts(files []goFile) map[string]string {
	out := map[string]string{}
	for _, f := range files {
		if f.test {
			continue
		}
		for _, decl := range f.ast.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if i >= len(vs.Values) {
						continue
					}
					if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						if v, err := strconv.Unquote(lit.Value); err == nil {
							out[f.dir+"."+name.Name] = v
						}
					}
				}
			}
		}
	}
	return out
}

// evalPath evaluates a route's path expression: string literals, constants
// of the tree (same package or imported from this module) and their sums.
func evalPath(f goFile, e ast.Expr, consts map[string]string) (string, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", false
		}
		v, err := strconv.Unquote(e.Value)
		return v, err == nil
	case *ast.BinaryExpr:
		if e.Op != token.ADD {
			return "", false
		}
		a, ok1 := evalPath(f, e.X, consts)
		b, ok2 := evalPath(f, e.Y, consts)
		return a + b, ok1 && ok2
	case *ast.Ident:
		v, ok := consts[f.dir+"."+e.Name]
		return v, ok
	case *ast.SelectorExpr:
		pkg, ok := e.X.(*ast.Ident)
		if !ok {
			return "", false
		}
		for _, imp := range f.ast.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			name := filepath.Base(p)
			if imp.Name != nil {
				name = imp.Name.Name
			}
			if name == pkg.Name && strings.HasPrefix(p, modulePath) {
				v, ok := consts[filepath.FromSlash(strings.TrimPrefix(p, modulePath))+"."+e.Sel.Name]
				return v, ok
			}
		}
	}
	return "", false
}

// routerRoutes finds every route the agent's API server is given: each
// call X.Handle(http.MethodY, path, handler) in the tree's non-test code
// (api/v1/server.Server.Handle), as path → methods.
func routerRoutes(t *testing.T, files []goFile) map[string][]string {
	t.Helper()
	consts := stringConsts(files)
	routes := map[string][]string{}
	for _, f := range files {
		if f.test {
			continue
		}
		ast.Inspect(f.ast, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) != 3 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name != "Handle" {
				return true
			}
			m, ok := call.Args[0].(*ast.SelectorExpr)
			if !ok || !strings.HasPrefix(m.Sel.Name, "Method") {
				return true
			}
			if x, ok := m.X.(*ast.Ident); !ok || x.Name != "http" {
				return true
			}
			path, ok := evalPath(f, call.Args[1], consts)
			if !ok {
				t.Errorf("%s: a route's path is not a constant this test can read: extend evalPath", f.rel)
				return true
			}
			routes[path] = append(routes[path], strings.ToUpper(strings.TrimPrefix(m.Sel.Name, "Method")))
			return true
		})
	}
	for p := range routes {
		sort.Strings(routes[p])
	}
	return routes
}

var backticked = regexp.MustCompile("`([^`]+)`")

// docRoutes reads docs/api.md's route table: rows whose first cell holds
// one `/v1/...` path and whose second cell lists its methods.
func docRoutes(t *testing.T, doc string) map[string][]string {
	t.Helper()
	routes := map[string][]string{}
	for i, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(line, "| `/") {
			continue
		}
		cells := strings.Split(line, "|")
		if len(cells) < 4 {
			t.Errorf("docs/api.md:%d: a route row needs path, methods and notes", i+1)
			continue
		}
		paths := backticked.FindAllStringSubmatch(cells[1], -1)
		if len(paths) != 1 {
			t.Errorf("docs/api.md:%d: want exactly one `path` in the first cell, got %q", i+1, cells[1])
			continue
		}
		path := paths[0][1]
		if _, dup := routes[path]; dup {
			t.Errorf("docs/api.md:%d: %s listed twice", i+1, path)
		}
		var methods []string
		for _, m := range strings.Split(cells[2], ",") {
			methods = append(methods, strings.TrimSpace(m))
		}
		sort.Strings(methods)
		routes[path] = methods
	}
	return routes
}

// TestAPIDocMatchesRouter: every route the agent registers is a row of
// docs/api.md with exactly its methods, and every row is a registered
// route.
func TestAPIDocMatchesRouter(t *testing.T) {
	router := routerRoutes(t, parseTree(t))
	if len(router) < 10 {
		t.Fatalf("found only %d routes in the tree: the search for Handle calls is broken", len(router))
	}
	doc := docRoutes(t, readDoc(t, "docs/api.md"))
	for path, methods := range router {
		dm, ok := doc[path]
		if !ok {
			t.Errorf("route %s (%s) is not in docs/api.md", path, strings.Join(methods, ", "))
			continue
		}
		if !slices.Equal(dm, methods) {
			t.Errorf("docs/api.md: %s methods %v, the router has %v", path, dm, methods)
		}
	}
	for path := range doc {
		if _, ok := router[path]; !ok {
			t.Errorf("docs/api.md lists %s, which no code registers", path)
		}
	}
}
