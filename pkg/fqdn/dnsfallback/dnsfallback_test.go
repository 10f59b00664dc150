package dnsfallback

import (
	"testing"

	"github.com/tendril-net/tendril/pkg/policy/api"
)

func TestWire(t *testing.T) {
	w, err := Wire("Api.Example.")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(w), "\x03Api\x07Example\x00"; got != want {
		t.Errorf("Wire = %q, want %q", got, want)
	}
	for _, bad := range []string{"", ".", "a..b", string(make([]byte, 64)) + ".x"} {
		if _, err := Wire(bad); err == nil {
			t.Errorf("Wire(%q): no error", bad)
		}
	}
}

func TestHashCaseInsensitive(t *testing.T) {
	a, _ := Wire("API.example.COM")
	b, _ := Wire("api.example.com")
	if Hash(a) != Hash(b) {
		t.Error("mixed case hashes differently")
	}
	c, _ := Wire("api.example.org")
	if Hash(b) == Hash(c) {
		t.Error("different names hash alike")
	}
	// FNV-1a 64 of the empty input is the offset basis; of "a" the
	// published 0xaf63dc4c8601ec8c.
	if Hash(nil) != 0xcbf29ce484222325 || Hash([]byte("A")) != 0xaf63dc4c8601ec8c {
		t.Errorf("not FNV-1a 64: %#x %#x", Hash(nil), Hash([]byte("A")))
	}
}

func TestCompile(t *testing.T) {
	name := func(s string) Entry { w, _ := Wire(s); return Entry{KindName, Hash(w)} }
	sfx := func(s string) Entry { w, _ := Wire(s); return Entry{KindSuffix, Hash(w)} }
	for _, c := range []struct {
		name  string
		rules []api.PortRuleDNS
		want  []Entry
		all   bool
	}{
		{"names and a suffix", []api.PortRuleDNS{{MatchName: "A.example."}, {MatchPattern: "b.example"}, {MatchPattern: "*.Example.org"}},
			[]Entry{name("a.example"), name("b.example"), sfx("example.org")}, false},
		{"lone star", []api.PortRuleDNS{{MatchName: "a.example"}, {MatchPattern: "*"}}, []Entry{name("a.example")}, true},
		{"star inside a label", []api.PortRuleDNS{{MatchPattern: "api-*.example"}}, nil, true},
		{"star in a later label", []api.PortRuleDNS{{MatchPattern: "a.*.example"}}, nil, true},
		{"invalid rule allows nothing", []api.PortRuleDNS{{MatchName: "a b"}}, nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := Compile(c.rules, false)
			if got.All != c.all {
				t.Errorf("All = %v, want %v", got.All, c.all)
			}
			if len(got.Entries) != len(c.want) {
				t.Errorf("entries %v, want %v", got.Entries, c.want)
			}
			for _, e := range c.want {
				if _, ok := got.Entries[e]; !ok {
					t.Errorf("missing %+v", e)
				}
			}
		})
	}
	if !Compile(nil, true).All {
		t.Error("allowAll did not make All")
	}
}
