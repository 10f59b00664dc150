package docs_test

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/tendril-net/tendril/pkg/testutil/binaries"
)

var bins *binaries.Builder

func TestMain(m *testing.M) { os.Exit(binaries.Run(m, &bins)) }

// helpText runs a binary with args and --help, once per command line.
type helpText struct {
	t     *testing.T
	mu    sync.Mutex
	cache map[string]string
}

func (h *helpText) get(bin string, path []string) string {
	h.t.Helper()
	key := bin + " " + strings.Join(path, " ")
	h.mu.Lock()
	defer h.mu.Unlock()
	if s, ok := h.cache[key]; ok {
		return s
	}
	exe, err := bins.Build(bin)
	if err != nil {
		h.t.Fatal(err)
	}
	out, err := exec.Command(exe, append(append([]string{}, path...), "--help")...).CombinedOutput()
	if err != nil {
		h.t.Fatalf("%s --help: %v\n%s", key, err, out)
	}
	h.cache[key] = string(out)
	return string(out)
}

var (
	flagLine = regexp.MustCompile(`(?m)^\s+(?:-([A-Za-z0-9]), )?--([a-z0-9-]+)(?: ([a-zA-Z0-9]+))?`)
	subLine  = regexp.MustCompile(`(?m)^  ([a-z][a-z0-9-]*)\s+\S`)
)

// helpFlags parses a --help text: flag names (long and short) and
// whether each takes a value.
func helpFlags(help string) (flags map[string]bool) {
	flags = map[string]bool{}
	for _, m := range flagLine.FindAllStringSubmatch(help, -1) {
		takes := m[3] != ""
		flags["--"+m[2]] = takes
		if m[1] != "" {
			flags["-"+m[1]] = takes
		}
	}
	return flags
}

// helpCommands are the subcommands a --help lists.
func helpCommands(help string) map[string]bool {
	out := map[string]bool{}
	_, cmds, ok := strings.Cut(help, "Available Commands:\n")
	if !ok {
		return out
	}
	cmds, _, _ = strings.Cut(cmds, "\n\n")
	for _, m := range subLine.FindAllStringSubmatch(cmds+"\n", -1) {
		out[m[1]] = true
	}
	return out
}

// checkInvocation checks one command line of a project binary: each word
// before the first argument is a subcommand its parent's help lists, and
// each flag is in the help of the command it is given to.
func checkInvocation(h *helpText, bin string, words []string) error {
	var path []string
	help := h.get(bin, nil)
	flags := helpFlags(help)
	for i := 0; i < len(words); i++ {
		w := words[i]
		switch {
		case w == "--":
			return nil
		case strings.HasPrefix(w, "-") && len(w) > 1:
			name, _, hasValue := strings.Cut(w, "=")
			takes, ok := flags[name]
			if !ok {
				return fmt.Errorf("%s %s: no flag %s in its --help", bin, strings.Join(path, " "), name)
			}
			if takes && !hasValue {
				i++ // its value
			}
		case helpCommands(help)[w]:
			path = append(path, w)
			help = h.get(bin, path)
			flags = helpFlags(help)
		default:
			// An argument: the command is found; its flags may follow.
			if len(path) == 0 && len(helpCommands(help)) > 0 {
				return fmt.Errorf("%s: no subcommand %q in its --help", bin, w)
			}
			if cmds := helpCommands(help); len(cmds) > 0 && !strings.Contains(help, "Flags:") {
				return fmt.Errorf("%s %s: no subcommand %q", bin, strings.Join(path, " "), w)
			}
		}
	}
	return nil
}

var (
	codeBlock  = regexp.MustCompile("(?s)```sh\n(.*?)```")
	inlineCode = regexp.MustCompile("`([^`\n]+)`")
	// A project binary at the start of a command: bin/NAME, NAME or $T
	// (the README's T="bin/tendril -H ...").
	invocation = regexp.MustCompile(`^(?:bin/)?(tendril(?:-agent|-operator|-cni)?)\b(.*)$`)
	makeTarget = regexp.MustCompile(`(?m)^([a-z][a-z0-9-]*):`)
)

// commandsOf splits a shell line into simple commands: $(...) bodies,
// then the parts between |, &&, ; and the comment.
func commandsOf(line string) []string {
	if i := strings.Index(line, " #"); i >= 0 {
		line = line[:i]
	}
	if strings.HasPrefix(strings.TrimSpace(line), "#") {
		return nil
	}
	var out []string
	for {
		i := strings.Index(line, "$(")
		if i < 0 {
			break
		}
		j := strings.Index(line[i:], ")")
		if j < 0 {
			break
		}
		out = append(out, line[i+2:i+j])
		line = line[:i] + line[i+j+1:]
	}
	for _, part := range regexp.MustCompile(`\|\||&&|[|;]`).Split(line, -1) {
		out = append(out, part)
	}
	return out
}

// TestReadmeCommandsMatchHelp: every command line of the README (code
// blocks and inline code) that runs a project binary uses subcommands and
// flags that binary's --help lists; every `make X` is a Makefile target;
// every --flag the prose names is a flag of one of the binaries.
func TestReadmeCommandsMatchHelp(t *testing.T) {
	readme := readDoc(t, "README.md")
	h := &helpText{t: t, cache: map[string]string{}}
	targets := map[string]bool{}
	for _, m := range makeTarget.FindAllStringSubmatch(readDoc(t, "Makefile"), -1) {
		targets[m[1]] = true
	}
	tVar := ""
	check := func(where, cmd string) {
		cmd = strings.TrimSpace(cmd)
		cmd = strings.TrimPrefix(cmd, "eval ")
		cmd = strings.Trim(cmd, `"`)
		if v, ok := strings.CutPrefix(cmd, `T="`); ok {
			tVar = strings.TrimSuffix(v, `"`)
			cmd = tVar
		}
		if rest, ok := strings.CutPrefix(cmd, "$T"); ok {
			if tVar == "" {
				t.Errorf("%s: $T before T= is set", where)
				return
			}
			cmd = tVar + rest
		}
		if rest, ok := strings.CutPrefix(cmd, "make "); ok {
			for _, target := range strings.Fields(rest) {
				if !targets[target] {
					t.Errorf("%s: make %s: no such Makefile target", where, target)
				}
			}
			return
		}
		m := invocation.FindStringSubmatch(cmd)
		if m == nil {
			return
		}
		if err := checkInvocation(h, m[1], strings.Fields(m[2])); err != nil {
			t.Errorf("%s: %q: %v", where, cmd, err)
		}
	}
	checked := 0
	for _, block := range codeBlock.FindAllStringSubmatch(readme, -1) {
		for _, line := range strings.Split(block[1], "\n") {
			for _, cmd := range commandsOf(line) {
				check("README code block", cmd)
				checked++
			}
		}
	}
	prose := codeBlock.ReplaceAllString(readme, "")
	allFlags := map[string]bool{}
	for _, bin := range []string{"tendril-agent", "tendril-operator", "tendril"} {
		for f := range helpFlags(h.get(bin, nil)) {
			allFlags[f] = true
		}
	}
	for _, m := range inlineCode.FindAllStringSubmatch(prose, -1) {
		code := m[1]
		switch {
		case strings.HasPrefix(code, "make "), invocation.MatchString(code) && strings.Contains(code, " "):
			check("README inline", code)
			checked++
		case strings.HasPrefix(code, "--"):
			name, _, _ := strings.Cut(code, "=")
			name = strings.Fields(name)[0]
			if !allFlags[name] && !subcommandFlag(h, name) {
				t.Errorf("README names %s, a flag of none of the binaries", name)
			}
		}
	}
	if checked < 20 {
		t.Fatalf("only %d README commands found: the parser is broken", checked)
	}
}

// subcommandFlag reports whether a flag belongs to one of tendril's
// commands (e.g. lab up's --nodes), searched one level down.
func subcommandFlag(h *helpText, name string) bool {
	for cmd := range helpCommands(h.get("tendril", nil)) {
		if cmd == "help" || cmd == "completion" {
			continue
		}
		help := h.get("tendril", []string{cmd})
		if _, ok := helpFlags(help)[name]; ok {
			return true
		}
		for sub := range helpCommands(help) {
			if _, ok := helpFlags(h.get("tendril", []string{cmd, sub}))[name]; ok {
				return true
			}
		}
	}
	return false
}
