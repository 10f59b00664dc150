// Command bpfenums generates Go constants from groups of #defines in a C
// header of the datapath (bpf/lib/enums.h), so that the values the BPF
// programs and user space share (drop reasons, event types, flags) are
// written once, in C, and the Go copy cannot drift.
//
// A group starts with a comment line `go:const <GoPrefix> <C_PREFIX>
// [type] [describe]` (the last line of its comment) and ends at the next
// blank line. It holds #defines of integer literals and comments only. A
// #define C_PREFIX_SOME_NAME becomes the constant GoPrefixSomeName of the
// given type (untyped when none); a comment above it becomes its doc
// comment, the comments above the directive the group's. In a describe
// group the comment after each #define is its description, and the output
// has a func GoPrefixNames() map[type]string of them.
//
// Usage (see pkg/datapath/maps/maps.go):
//
//	go run ./hack/bpfenums -in bpf/lib/enums.h -out pkg/datapath/maps/enums_gen.go -package maps
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"go/format"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

func main() {
	in := flag.String("in", "", "C header to read")
	out := flag.String("out", "", "Go file to write")
	pkg := flag.String("package", "", "Go package of the output")
	flag.Parse()
	if *in == "" || *out == "" || *pkg == "" {
		fmt.Fprintln(os.Stderr, "usage: bpfenums -in header.h -out file.go -package name")
		os.Exit(2)
	}
	if err := run(*in, *out, *pkg); err != nil {
		fmt.Fprintln(os.Stderr, "bpfenums:", err)
		os.Exit(1)
	}
}

func run(in, out, pkg string) error {
	src, err := os.ReadFile(in)
	if err != nil {
		return fmt.Errorf("read header: %w", err)
	}
	name, err := moduleRelative(in)
	if err != nil {
		return err
	}
	groups, err := parse(string(src))
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	code, err := render(pkg, name, groups)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if err := os.WriteFile(out, code, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", out, err)
	}
	return nil
}

// moduleRelative names path from the root of its Go module, so the
// generated file says the same wherever the repository is checked out.
func moduleRelative(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("resolve %s: %w", path, err)
	}
	for dir := filepath.Dir(abs); ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			rel, err := filepath.Rel(dir, abs)
			if err != nil {
				return "", fmt.Errorf("resolve %s: %w", path, err)
			}
			return filepath.ToSlash(rel), nil
		}
		if dir == filepath.Dir(dir) {
			return "", fmt.Errorf("%s is not inside a Go module", path)
		}
	}
}

// group is one go:const group of the header.
type group struct {
	line     int
	doc      []string
	goPrefix string
	cPrefix  string
	goType   string // "" for untyped constants
	describe bool
	consts   []constant
}

// constant is one #define of a group.
type constant struct {
	line    int
	cName   string
	goName  string
	value   string // the literal as the header writes it
	doc     []string
	comment string // the comment after the #define
}

const directive = "go:const"

var (
	defineRe = regexp.MustCompile(`^#define\s+([A-Za-z_][A-Za-z0-9_]*)\s+(\S+)\s*(.*)$`)
	identRe  = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9]*$`)
	goTypes  = map[string]bool{"uint8": true, "uint16": true, "uint32": true, "uint64": true, "int": true, "uint": true}
)

// parse reads the go:const groups of a C header.
func parse(src string) ([]group, error) {
	var (
		groups    []group
		cur       *group
		pending   []string // comment lines since the last line of code or blank line
		inComment bool
	)
	closeGroup := func() error {
		if cur == nil {
			return nil
		}
		if len(cur.consts) == 0 {
			return fmt.Errorf("line %d: go:const group with no #define", cur.line)
		}
		groups = append(groups, *cur)
		cur = nil
		return nil
	}
	// comment takes one line of comment text; it opens a group when the
	// text is a directive.
	comment := func(n int, text string, closes bool) error {
		text = strings.TrimSpace(text)
		rest, ok := strings.CutPrefix(text, directive)
		if !ok || (rest != "" && rest[0] != ' ') {
			pending = append(pending, text)
			return nil
		}
		if !closes {
			return fmt.Errorf("line %d: a %s line must end its comment", n, directive)
		}
		if cur != nil {
			return fmt.Errorf("line %d: %s before the group of line %d ended (a blank line ends a group)", n, directive, cur.line)
		}
		g, err := parseDirective(n, rest)
		if err != nil {
			return err
		}
		g.doc = trimBlank(pending)
		pending = nil
		cur = &g
		return nil
	}
	for i, raw := range strings.Split(src, "\n") {
		n := i + 1
		line := strings.TrimSpace(raw)
		if inComment {
			text, closes := strings.CutSuffix(line, "*/")
			if !closes && strings.Contains(line, "*/") {
				if cur != nil {
					return nil, fmt.Errorf("line %d: code after a comment in a go:const group", n)
				}
				inComment = false
				pending = nil
				continue
			}
			text = strings.TrimPrefix(strings.TrimSpace(text), "*")
			if err := comment(n, text, closes); err != nil {
				return nil, err
			}
			inComment = !closes
			continue
		}
		switch {
		case line == "":
			if err := closeGroup(); err != nil {
				return nil, err
			}
			pending = nil
		case strings.HasPrefix(line, "//"):
			if err := comment(n, strings.TrimPrefix(line, "//"), true); err != nil {
				return nil, err
			}
		case strings.HasPrefix(line, "/*"):
			body := strings.TrimPrefix(line, "/*")
			text, after, closes := strings.Cut(body, "*/")
			if closes && strings.TrimSpace(after) != "" {
				if cur != nil {
					return nil, fmt.Errorf("line %d: code after a comment in a go:const group", n)
				}
				pending = nil
				continue
			}
			if err := comment(n, text, closes); err != nil {
				return nil, err
			}
			inComment = !closes
		case cur != nil:
			c, err := parseDefine(n, line, cur)
			if err != nil {
				return nil, err
			}
			c.doc = trimBlank(pending)
			pending = nil
			cur.consts = append(cur.consts, c)
		default:
			pending = nil
		}
	}
	if inComment {
		return nil, errors.New("unterminated comment at end of file")
	}
	if err := closeGroup(); err != nil {
		return nil, err
	}
	return groups, checkNames(groups)
}

func parseDirective(n int, args string) (group, error) {
	f := strings.Fields(args)
	if len(f) < 2 || len(f) > 4 {
		return group{}, fmt.Errorf("line %d: want %s <GoPrefix> <C_PREFIX> [type] [describe]", n, directive)
	}
	g := group{line: n, goPrefix: f[0], cPrefix: f[1]}
	if !identRe.MatchString(g.goPrefix) {
		return group{}, fmt.Errorf("line %d: Go prefix %q is not an identifier", n, g.goPrefix)
	}
	for _, a := range f[2:] {
		switch {
		case a == "describe" && !g.describe:
			g.describe = true
		case goTypes[a] && g.goType == "":
			g.goType = a
		default:
			return group{}, fmt.Errorf("line %d: unknown or repeated %s argument %q", n, directive, a)
		}
	}
	if g.describe && g.goType == "" {
		return group{}, fmt.Errorf("line %d: a describe group needs a type", n)
	}
	return g, nil
}

func parseDefine(n int, line string, g *group) (constant, error) {
	m := defineRe.FindStringSubmatch(line)
	if m == nil {
		return constant{}, fmt.Errorf("line %d: only #defines and comments may be in a go:const group", n)
	}
	c := constant{line: n, cName: m[1], value: m[2]}
	if _, err := strconv.ParseInt(c.value, 0, 64); err != nil {
		return constant{}, fmt.Errorf("line %d: %s: value %q is not an integer literal", n, c.cName, c.value)
	}
	switch trail := strings.TrimSpace(m[3]); {
	case trail == "":
	case strings.HasPrefix(trail, "//"):
		c.comment = strings.TrimSpace(strings.TrimPrefix(trail, "//"))
	case strings.HasPrefix(trail, "/*") && strings.HasSuffix(trail, "*/") && strings.Count(trail, "*/") == 1:
		c.comment = strings.TrimSpace(trail[2 : len(trail)-2])
	default:
		return constant{}, fmt.Errorf("line %d: %s: after the value only a one-line comment may follow", n, c.cName)
	}
	rest, ok := strings.CutPrefix(c.cName, g.cPrefix)
	if !ok || rest == "" {
		return constant{}, fmt.Errorf("line %d: %s does not start with the group's prefix %s", n, c.cName, g.cPrefix)
	}
	name, err := goName(rest)
	if err != nil {
		return constant{}, fmt.Errorf("line %d: %s: %w", n, c.cName, err)
	}
	c.goName = g.goPrefix + name
	if g.describe && c.comment == "" {
		return constant{}, fmt.Errorf("line %d: %s: a describe group needs a description after each #define", n, c.cName)
	}
	return c, nil
}

// initialisms keep Go's spelling of the words they name.
var initialisms = map[string]string{
	"CT": "CT", "ID": "ID", "IP": "IP", "IPV4": "IPv4", "IPV6": "IPv6",
	"TCP": "TCP", "UDP": "UDP", "ICMP": "ICMP", "MAC": "MAC",
}

// goName turns SOME_C_NAME into SomeCName.
func goName(cName string) (string, error) {
	var b strings.Builder
	for _, w := range strings.Split(cName, "_") {
		if w == "" {
			return "", errors.New("empty word in name")
		}
		if s, ok := initialisms[w]; ok {
			b.WriteString(s)
			continue
		}
		b.WriteString(w[:1])
		b.WriteString(strings.ToLower(w[1:]))
	}
	return b.String(), nil
}

func checkNames(groups []group) error {
	seen := map[string]int{}
	for _, g := range groups {
		values := map[uint64]string{}
		for _, c := range g.consts {
			if at, ok := seen[c.goName]; ok {
				return fmt.Errorf("line %d: %s gives Go name %s, as line %d does", c.line, c.cName, c.goName, at)
			}
			seen[c.goName] = c.line
			if !g.describe {
				continue
			}
			v, _ := strconv.ParseUint(c.value, 0, 64)
			if other, ok := values[v]; ok {
				return fmt.Errorf("line %d: %s has the value of %s: their descriptions would collide", c.line, c.cName, other)
			}
			values[v] = c.cName
		}
		if _, ok := seen[g.goPrefix+"Names"]; ok && g.describe {
			return fmt.Errorf("line %d: %sNames is also a constant", g.line, g.goPrefix)
		}
	}
	return nil
}

// render writes the Go file of the groups.
func render(pkg, source string, groups []group) ([]byte, error) {
	var b bytes.Buffer
	fmt.Fprintf(&b, "// Code generated by hack/bpfenums from %s; DO NOT EDIT.\n\n", source)
	fmt.Fprintf(&b, "package %s\n", pkg)
	for _, g := range groups {
		b.WriteString("\n")
		writeDoc(&b, "", g.doc)
		fmt.Fprintf(&b, "// From %s* of %s.\n", g.cPrefix, source)
		b.WriteString("const (\n")
		for _, c := range g.consts {
			writeDoc(&b, "\t", c.doc)
			typ := ""
			if g.goType != "" {
				typ = " " + g.goType
			}
			trail := c.cName
			if c.comment != "" {
				trail += ": " + c.comment
			}
			fmt.Fprintf(&b, "\t%s%s = %s // %s\n", c.goName, typ, c.value, trail)
		}
		b.WriteString(")\n")
		if g.describe {
			fmt.Fprintf(&b, "\n// %sNames describes every %s constant, for the CLI, events and metrics.\n", g.goPrefix, g.goPrefix)
			fmt.Fprintf(&b, "func %sNames() map[%s]string {\n\treturn map[%s]string{\n", g.goPrefix, g.goType, g.goType)
			for _, c := range g.consts {
				fmt.Fprintf(&b, "\t\t%s: %s,\n", c.goName, strconv.Quote(c.comment))
			}
			b.WriteString("\t}\n}\n")
		}
	}
	code, err := format.Source(b.Bytes())
	if err != nil {
		return nil, fmt.Errorf("format generated code: %w\n%s", err, b.Bytes())
	}
	return code, nil
}

func writeDoc(b *bytes.Buffer, indent string, doc []string) {
	for _, l := range doc {
		if l == "" {
			fmt.Fprintf(b, "%s//\n", indent)
			continue
		}
		fmt.Fprintf(b, "%s// %s\n", indent, l)
	}
}

// trimBlank drops the empty lines around a comment's text.
func trimBlank(lines []string) []string {
	for len(lines) > 0 && lines[0] == "" {
		lines = lines[1:]
	}
	for len(lines) > 0 && lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	return lines
}
