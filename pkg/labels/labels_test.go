package labels

import (
	"encoding/json"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestParse(t *testing.T) {
	tests := []struct {
		in      string
		want    Label
		wantErr string
	}{
		{in: "k8s:app=web", want: Label{SourceK8s, "app", "web"}},
		{in: "reserved:host", want: Label{SourceReserved, "host", ""}},
		{in: "app=web", want: Label{SourceUnspec, "app", "web"}},
		{in: "app", want: Label{SourceUnspec, "app", ""}},
		{in: "app=a:b", want: Label{SourceUnspec, "app", "a:b"}},
		{in: "k8s:app=a=b", want: Label{SourceK8s, "app", "a=b"}},
		{in: "cidr:10.0.0.0/8", want: Label{SourceCIDR, "10.0.0.0/8", ""}},
		{in: "cidr:2001:db8::/32", want: Label{SourceCIDR, "2001:db8::/32", ""}},
		{in: "any:app=web", want: Label{SourceAny, "app", "web"}},
		{in: "k8s:io.kubernetes.pod.namespace=default", want: Label{SourceK8s, KeyPodNamespace, "default"}},
		{in: "k8s:app.kubernetes.io/name=db", want: Label{SourceK8s, "app.kubernetes.io/name", "db"}},
		{in: "container:app=web", wantErr: `unknown source "container"`},
		{in: "k8s:", wantErr: "empty key"},
		{in: "=web", wantErr: "empty key"},
		{in: "", wantErr: "empty key"},
		{in: "k8s:app=a,b", wantErr: "contains ','"},
		{in: "k8s:a;b=c", wantErr: "contains ','"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := Parse(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Parse(%q) error = %v, want one containing %q", tt.in, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse(%q): %v", tt.in, err)
			}
			if got != tt.want {
				t.Fatalf("Parse(%q) = %+v, want %+v", tt.in, got, tt.want)
			}
			// The string form parses back to the same label.
			again, err := Parse(got.String())
			if err != nil || again != got {
				t.Fatalf("round trip of %q via %q = %+v, %v", tt.in, got.String(), again, err)
			}
		})
	}
}

func TestLabelString(t *testing.T) {
	tests := []struct {
		l    Label
		want string
	}{
		{Label{SourceK8s, "app", "web"}, "k8s:app=web"},
		{Label{SourceReserved, "world", ""}, "reserved:world"},
		{Label{SourceUnspec, "app", "web"}, "unspec:app=web"},
	}
	for _, tt := range tests {
		if got := tt.l.String(); got != tt.want {
			t.Errorf("%+v.String() = %q, want %q", tt.l, got, tt.want)
		}
	}
}

func TestMatches(t *testing.T) {
	tests := []struct {
		l, sel string
		want   bool
	}{
		{"k8s:app=web", "k8s:app=web", true},
		{"k8s:app=web", "any:app=web", true},
		{"unspec:app=web", "any:app=web", true},
		{"k8s:app=web", "unspec:app=web", false},
		{"k8s:app=web", "k8s:app=db", false},
		{"k8s:app=web", "k8s:tier=web", false},
		{"reserved:host", "reserved:host", true},
		{"reserved:host", "reserved:host=x", false},
	}
	for _, tt := range tests {
		if got := MustParse(tt.l).Matches(MustParse(tt.sel)); got != tt.want {
			t.Errorf("%s matches %s = %v, want %v", tt.l, tt.sel, got, tt.want)
		}
	}
}

func TestSetIsSortedAndDeduplicated(t *testing.T) {
	tests := []struct {
		name    string
		in      []string
		want    string
		wantErr string
	}{
		{name: "empty", in: nil, want: ""},
		{name: "sorted by string form", in: []string{"k8s:b=1", "k8s:a.b=2", "k8s:a=3", "reserved:host"},
			want: "k8s:a.b=2,k8s:a=3,k8s:b=1,reserved:host"},
		{name: "same label twice counts once", in: []string{"k8s:app=web", "k8s:app=web"}, want: "k8s:app=web"},
		{name: "same key in two sources", in: []string{"k8s:app=web", "unspec:app=db"}, want: "k8s:app=web,unspec:app=db"},
		{name: "two values for one key", in: []string{"k8s:app=web", "k8s:app=db"}, wantErr: "two values for one key"},
		{name: "invalid label", in: []string{"k8s:app=web", "nope:x"}, wantErr: "unknown source"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := FromStrings(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("FromStrings(%q) error = %v, want %q", tt.in, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.String() != tt.want {
				t.Fatalf("String() = %q, want %q", got.String(), tt.want)
			}
			// Any input order gives the same set.
			rev := slices.Clone(tt.in)
			slices.Reverse(rev)
			other, err := FromStrings(rev)
			if err != nil || !other.Equal(got) || other.Key() != got.Key() {
				t.Fatalf("reversed input gives %q (%v), want %q", other, err, got)
			}
			// The string form parses back.
			back, err := ParseSet(got.String())
			if err != nil || !back.Equal(got) {
				t.Fatalf("ParseSet(%q) = %q, %v", got.String(), back, err)
			}
		})
	}
}

func TestKeyMatchesSortedStrings(t *testing.T) {
	// The key is what identity.LabelsKey makes of the strings (sorted,
	// joined by ';'), so identities keyed either way agree.
	ls, err := FromStrings([]string{"k8s:z=1", "k8s:app=web", "reserved:init", "k8s:app.kubernetes.io/name=x"})
	if err != nil {
		t.Fatal(err)
	}
	ss := ls.Strings()
	sorted := slices.Clone(ss)
	sort.Strings(sorted)
	if !slices.Equal(ss, sorted) {
		t.Fatalf("Strings() = %q is not sorted", ss)
	}
	if want := strings.Join(sorted, ";"); ls.Key() != want {
		t.Fatalf("Key() = %q, want %q", ls.Key(), want)
	}
}

func TestParseSet(t *testing.T) {
	got, err := ParseSet(" k8s:app=web , reserved:host ")
	if err != nil {
		t.Fatal(err)
	}
	if got.String() != "k8s:app=web,reserved:host" {
		t.Fatalf("got %q", got)
	}
	if empty, err := ParseSet("  "); err != nil || empty.Len() != 0 {
		t.Fatalf("ParseSet of blanks = %q, %v", empty, err)
	}
}

func TestEqualHasGet(t *testing.T) {
	a, _ := FromStrings([]string{"k8s:app=web", "k8s:tier=front", "reserved:host"})
	b, _ := FromStrings([]string{"reserved:host", "k8s:tier=front", "k8s:app=web"})
	c, _ := FromStrings([]string{"k8s:app=web", "k8s:tier=back", "reserved:host"})
	if !a.Equal(b) || a.Equal(c) || a.Equal(Labels{}) || !(Labels{}).Equal(Labels{}) {
		t.Fatal("Equal is wrong")
	}
	hasTests := []struct {
		sel  string
		want bool
	}{
		{"k8s:app=web", true},
		{"any:app=web", true},
		{"any:tier=back", false},
		{"unspec:app=web", false},
		{"reserved:host", true},
		{"reserved:world", false},
	}
	for _, tt := range hasTests {
		if got := a.Has(MustParse(tt.sel)); got != tt.want {
			t.Errorf("Has(%s) = %v, want %v", tt.sel, got, tt.want)
		}
	}
	getTests := []struct {
		source, key string
		want        string
		found       bool
	}{
		{SourceK8s, "app", "web", true},
		{SourceAny, "tier", "front", true},
		{SourceUnspec, "app", "", false},
		{SourceReserved, "host", "", true},
		{SourceK8s, "nope", "", false},
	}
	for _, tt := range getTests {
		v, ok := a.Get(tt.source, tt.key)
		if v != tt.want || ok != tt.found {
			t.Errorf("Get(%s, %s) = %q, %v; want %q, %v", tt.source, tt.key, v, ok, tt.want, tt.found)
		}
	}
}

func TestMerge(t *testing.T) {
	a, _ := FromStrings([]string{"k8s:app=web", "k8s:tier=front"})
	b, _ := FromStrings([]string{"k8s:tier=back", "reserved:host"})
	got := a.Merge(b)
	if want := "k8s:app=web,k8s:tier=back,reserved:host"; got.String() != want {
		t.Fatalf("Merge = %q, want %q", got, want)
	}
	if a.String() != "k8s:app=web,k8s:tier=front" {
		t.Fatalf("Merge changed its receiver: %q", a)
	}
}

func TestFromK8sAndPodLabels(t *testing.T) {
	ls, err := FromK8s(map[string]string{"app": "web", "app.kubernetes.io/part-of": "shop"})
	if err != nil {
		t.Fatal(err)
	}
	if want := "k8s:app.kubernetes.io/part-of=shop,k8s:app=web"; ls.String() != want {
		t.Fatalf("FromK8s = %q, want %q", ls, want)
	}
	if _, err := FromK8s(map[string]string{"a": "x,y"}); err == nil {
		t.Fatal("FromK8s accepted a value with a comma")
	}

	pod, err := PodLabels(Pod{
		Namespace:       "shop",
		ServiceAccount:  "web-sa",
		Labels:          map[string]string{"app": "web", KeyPodNamespace: "kube-system"},
		NamespaceLabels: map[string]string{"team": "a", "kubernetes.io/metadata.name": "shop"},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"k8s:app=web",
		"k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name=shop",
		"k8s:io.cilium.k8s.namespace.labels.team=a",
		"k8s:io.cilium.k8s.policy.serviceaccount=web-sa",
		"k8s:io.kubernetes.pod.namespace=shop", // the pod's own label cannot claim another namespace
	}
	if !slices.Equal(pod.Strings(), want) {
		t.Fatalf("PodLabels =\n%q\nwant\n%q", pod.Strings(), want)
	}
}

func TestDefaultFilter(t *testing.T) {
	f, err := NewFilter(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		label string
		want  bool
	}{
		// What policies select on stays.
		{"k8s:app=web", true},
		{"k8s:tier=front", true},
		{"k8s:app.kubernetes.io/name=web", true},
		{"k8s:io.kubernetes.pod.namespace=shop", true},
		{"k8s:io.cilium.k8s.namespace.labels.team=a", true},
		{"k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name=shop", true},
		{"k8s:io.cilium.k8s.policy.serviceaccount=web-sa", true},
		{"k8s:io.cilium.k8s.policy.cluster=default", true},
		{"reserved:host", true},
		{"cidr:10.0.0.0/8", true},
		// Per-pod and per-rollout values go.
		{"k8s:pod-template-hash=7d9f8c", false},
		{"k8s:controller-revision-hash=5b6c", false},
		{"k8s:pod-template-generation=3", false},
		{"k8s:statefulset.kubernetes.io/pod-name=db-0", false},
		{"k8s:apps.kubernetes.io/pod-index=0", false},
		{"k8s:job-name=backup-28311", false},
		{"k8s:controller-uid=1f0e", false},
		{"k8s:batch.kubernetes.io/job-name=backup-28311", false},
		{"k8s:batch.kubernetes.io/controller-uid=1f0e", false},
		{"k8s:batch.kubernetes.io/job-completion-index=2", false},
		{"k8s:kubernetes.io/hostname=node-1", false},
		{"k8s:beta.kubernetes.io/arch=amd64", false},
		{"k8s:node.beta.kubernetes.io/instance-type=m5", false},
		{"k8s:topology.kubernetes.io/zone=a", false},
		{"k8s:k8s.io/cluster-service=true", false},
		{"k8s:io.kubernetes.pod.name=web-1", false},
		{"k8s:io.kubernetes.pod.uid=abc", false},
		{"k8s:annotation.foo=bar", false},
		// Anchored patterns do not reach into other keys.
		{"k8s:my-job-name-owner=x", true},
		{"k8s:pod-template-hash-owner=x", true},
		{"k8s:example.kubernetes.io/team=a", true},
	}
	for _, tt := range tests {
		if got := f.Relevant(MustParse(tt.label)); got != tt.want {
			t.Errorf("Relevant(%s) = %v, want %v", tt.label, got, tt.want)
		}
	}
}

func TestFilterConfigured(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		keep []string
		drop []string
	}{
		{
			name: "include restricts to named keys plus keep",
			cfg:  Config{Keep: DefaultKeepPatterns(), Include: []string{"app$", "team"}, Exclude: DefaultExcludePatterns()},
			keep: []string{"k8s:app=web", "k8s:team=a", "k8s:team-lead=b", "k8s:io.kubernetes.pod.namespace=x", "reserved:world"},
			drop: []string{"k8s:app-version=2", "k8s:env=prod", "k8s:pod-template-hash=1"},
		},
		{
			name: "longer include beats shorter exclude",
			cfg:  Config{Include: []string{`example\.com/team$`}, Exclude: []string{`example\.com`}},
			keep: []string{"k8s:example.com/team=a"},
			drop: []string{"k8s:example.com/build=7", "k8s:app=web"},
		},
		{
			name: "longer exclude beats shorter include",
			cfg:  Config{Include: []string{`example\.com`}, Exclude: []string{`example\.com/build`}},
			keep: []string{"k8s:example.com/team=a"},
			drop: []string{"k8s:example.com/build=7"},
		},
		{
			name: "a tie excludes",
			cfg:  Config{Include: []string{`app`}, Exclude: []string{`app`}},
			drop: []string{"k8s:app=web"},
		},
		{
			name: "keep wins over any exclude",
			cfg:  Config{Keep: []string{`io\.kubernetes\.pod\.namespace$`}, Exclude: []string{`.*`}},
			keep: []string{"k8s:io.kubernetes.pod.namespace=x"},
			drop: []string{"k8s:app=web"},
		},
		{
			name: "source-restricted pattern",
			cfg:  Config{Exclude: []string{`unspec:app`}},
			keep: []string{"k8s:app=web"},
			drop: []string{"unspec:app=web"},
		},
		{
			name: "any source is no restriction",
			cfg:  Config{Exclude: []string{`any:app`}},
			drop: []string{"k8s:app=web", "unspec:app=web"},
		},
		{
			name: "no patterns keeps everything",
			cfg:  Config{},
			keep: []string{"k8s:pod-template-hash=1", "reserved:host"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := NewFilter(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range tt.keep {
				if !f.Relevant(MustParse(l)) {
					t.Errorf("%s dropped, want kept", l)
				}
			}
			for _, l := range tt.drop {
				if f.Relevant(MustParse(l)) {
					t.Errorf("%s kept, want dropped", l)
				}
			}
		})
	}
}

func TestFilterSplit(t *testing.T) {
	f, err := NewFilter(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	ls, _ := FromStrings([]string{"k8s:app=web", "k8s:pod-template-hash=abc", "k8s:io.kubernetes.pod.namespace=shop"})
	rel, ign := f.Split(ls)
	if rel.String() != "k8s:app=web,k8s:io.kubernetes.pod.namespace=shop" || ign.String() != "k8s:pod-template-hash=abc" {
		t.Fatalf("Split = %q / %q", rel, ign)
	}
	if !f.IdentityLabels(ls).Equal(rel) {
		t.Fatal("IdentityLabels differs from Split")
	}
	// Two pods of one Deployment revision-hash apart share an identity.
	other, _ := FromStrings([]string{"k8s:app=web", "k8s:pod-template-hash=def", "k8s:io.kubernetes.pod.namespace=shop"})
	if f.IdentityLabels(ls).Key() != f.IdentityLabels(other).Key() {
		t.Fatal("pods differing only in pod-template-hash got different identity keys")
	}
}

func TestFilterBadPatterns(t *testing.T) {
	for _, cfg := range []Config{
		{Keep: []string{"("}},
		{Include: []string{"k8s:"}},
		{Exclude: []string{"[a-"}},
	} {
		if _, err := NewFilter(cfg); err == nil {
			t.Errorf("NewFilter(%+v) accepted a bad pattern", cfg)
		}
	}
}

func TestConfigFlags(t *testing.T) {
	cfg := DefaultConfig()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	cfg.Flags(fs)
	if err := fs.Parse([]string{"--identity-labels-include", "app$", "--identity-labels-include", "team", "--identity-labels-exclude", "x{1,2}"}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.Include, []string{"app$", "team"}) {
		t.Fatalf("Include = %q", cfg.Include)
	}
	// Regexps with commas survive: the flags do not split on them.
	if !slices.Equal(cfg.Exclude, []string{"x{1,2}"}) {
		t.Fatalf("Exclude = %q", cfg.Exclude)
	}
	if !slices.Equal(cfg.Keep, DefaultKeepPatterns()) {
		t.Fatalf("Keep = %q, want the defaults", cfg.Keep)
	}
	if _, err := NewFilter(cfg); err != nil {
		t.Fatal(err)
	}
}

// A label's JSON form is that of CiliumNetworkPolicy rule labels.
func TestLabelJSON(t *testing.T) {
	data, err := json.Marshal([]Label{MustParse("k8s:app=web"), MustParse("reserved:host")})
	if err != nil {
		t.Fatal(err)
	}
	if want := `[{"source":"k8s","key":"app","value":"web"},{"source":"reserved","key":"host"}]`; string(data) != want {
		t.Fatalf("JSON %s, want %s", data, want)
	}
	var back []Label
	if err := json.Unmarshal(data, &back); err != nil || len(back) != 2 || back[0] != MustParse("k8s:app=web") || back[1] != MustParse("reserved:host") {
		t.Fatalf("read back %v, %v", back, err)
	}
	if !IsKnownSource(SourceK8s) || IsKnownSource("container") {
		t.Fatal("IsKnownSource")
	}
}
