package labels

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/spf13/pflag"
)

// Config chooses which labels are identity-relevant. Every label that
// reaches an identity splits the pods carrying different values into
// different identities, so labels that differ per pod or per rollout
// (hashes, pod names, generations) must stay out: they would give every
// pod its own identity and churn the cluster-wide allocator.
//
// A pattern is "[source:]regexp". The regexp is anchored at the start of
// the label's key only ("app" also matches "app-tier"; "app$" only "app");
// a source restricts it to labels of that source, and without one (or with
// "any:") it applies to every source. Decision, in order:
//
//  1. a label matching a Keep pattern is relevant;
//  2. otherwise the longest match among Include and Exclude patterns
//     decides (the more specific pattern wins; a tie excludes);
//  3. a label no pattern matches is relevant, unless Include is non-empty:
//     then only what Include (or Keep) names is.
type Config struct {
	// Keep patterns are always relevant: a workload's namespace and its
	// service account are what policies select on.
	Keep []string `mapstructure:"identity-labels-keep"`
	// Include patterns, when any is given, restrict identities to the
	// labels they (or Keep) match.
	Include []string `mapstructure:"identity-labels-include"`
	// Exclude patterns name labels that are never relevant, unless a Keep
	// pattern or a longer Include match says otherwise.
	Exclude []string `mapstructure:"identity-labels-exclude"`
}

// DefaultKeepPatterns are the labels Tendril derives from a pod's context
// (namespace, its labels, service account, cluster), the well-known
// application labels, and every reserved label.
func DefaultKeepPatterns() []string {
	return []string{
		SourceReserved + ":.*",
		regexp.QuoteMeta(KeyPodNamespace) + "$",
		regexp.QuoteMeta(KeyNamespaceLabelsPrefix),
		regexp.QuoteMeta(KeyServiceAccount) + "$",
		regexp.QuoteMeta(KeyCluster) + "$",
		`app\.kubernetes\.io/`,
	}
}

// DefaultExcludePatterns are labels set per pod or per rollout by
// Kubernetes controllers, and node or runtime metadata: the list Cilium
// documents as not identity-relevant, plus job-name, which the Job
// controller sets to a name unique to each Job run.
func DefaultExcludePatterns() []string {
	return []string{
		`io\.kubernetes`,                        // container runtime metadata (pod name, uid, ...)
		`kubernetes\.io`,                        // kubernetes.io/hostname, kubernetes.io/arch, ...
		`.*beta\.kubernetes\.io`,                // beta.kubernetes.io/* and <x>.beta.kubernetes.io/*
		`k8s\.io`,                               // k8s.io/*
		`topology\.kubernetes\.io`,              // zone and region of the node
		`statefulset\.kubernetes\.io/pod-name$`, // one value per StatefulSet pod
		`apps\.kubernetes\.io/pod-index$`,       // one value per StatefulSet pod
		`batch\.kubernetes\.io/`,                // job-name, controller-uid, job-completion-index
		`controller-uid$`,                       // one value per Job (legacy key)
		`job-name$`,                             // one value per Job (legacy key)
		`pod-template-hash$`,                    // one value per Deployment revision
		`controller-revision-hash$`,             // one value per StatefulSet/DaemonSet revision
		`pod-template-generation$`,              // one value per DaemonSet generation
		`annotation\.`,                          // annotations exposed as labels
		`etcd_node$`,                            // per-member etcd label
	}
}

// DefaultConfig returns the default patterns and no Include restriction.
func DefaultConfig() Config {
	return Config{Keep: DefaultKeepPatterns(), Exclude: DefaultExcludePatterns()}
}

// Flags registers the filter's flags. Each flag may be repeated; giving a
// flag replaces that list's defaults.
func (c *Config) Flags(fs *pflag.FlagSet) {
	fs.StringArrayVar(&c.Keep, "identity-labels-keep", c.Keep,
		"Label pattern ([source:]regexp on the key, anchored at its start) always kept in identities; replaces the defaults")
	fs.StringArrayVar(&c.Include, "identity-labels-include", c.Include,
		"Label pattern to include in identities; once one is given, only included (and kept) labels count")
	fs.StringArrayVar(&c.Exclude, "identity-labels-exclude", c.Exclude,
		"Label pattern to leave out of identities unless a longer include match or a keep pattern says otherwise; replaces the defaults")
}

// pattern is one compiled Config pattern.
type pattern struct {
	text   string
	source string // empty: any source
	re     *regexp.Regexp
}

func parsePattern(text string) (pattern, error) {
	p := pattern{text: text}
	expr := text
	if source, rest, ok := strings.Cut(text, ":"); ok && isKnownSource(source) {
		expr = rest
		if source != SourceAny {
			p.source = source
		}
	}
	if expr == "" {
		return pattern{}, fmt.Errorf("label pattern %q: empty expression", text)
	}
	re, err := regexp.Compile(`^(?:` + expr + `)`)
	if err != nil {
		return pattern{}, fmt.Errorf("label pattern %q: %w", text, err)
	}
	// Leftmost-longest, so that the length of a match measures how much of
	// the key a pattern accounts for (rule 2 compares lengths).
	re.Longest()
	p.re = re
	return p, nil
}

// matchLen is the length of the key prefix p matches, or -1.
func (p pattern) matchLen(l Label) int {
	if p.source != "" && p.source != l.Source {
		return -1
	}
	loc := p.re.FindStringIndex(l.Key)
	if loc == nil {
		return -1
	}
	return loc[1]
}

func longestMatch(ps []pattern, l Label) int {
	best := -1
	for _, p := range ps {
		best = max(best, p.matchLen(l))
	}
	return best
}

// Filter picks the identity-relevant labels of a set. It is immutable and
// safe for concurrent use.
type Filter struct {
	keep, include, exclude []pattern
}

// NewFilter compiles a Config.
func NewFilter(cfg Config) (*Filter, error) {
	f := &Filter{}
	for _, list := range []struct {
		name string
		in   []string
		out  *[]pattern
	}{{"keep", cfg.Keep, &f.keep}, {"include", cfg.Include, &f.include}, {"exclude", cfg.Exclude, &f.exclude}} {
		for _, text := range list.in {
			p, err := parsePattern(text)
			if err != nil {
				return nil, fmt.Errorf("identity label %s patterns: %w", list.name, err)
			}
			*list.out = append(*list.out, p)
		}
	}
	return f, nil
}

// Relevant reports whether l belongs in an identity (see Config for the
// rules).
func (f *Filter) Relevant(l Label) bool {
	if longestMatch(f.keep, l) >= 0 {
		return true
	}
	inc, exc := longestMatch(f.include, l), longestMatch(f.exclude, l)
	switch {
	case inc > exc:
		return true
	case exc >= 0:
		return false
	default:
		return len(f.include) == 0
	}
}

// Split divides a set into its identity-relevant labels and the others
// (which are still worth showing, for example in endpoint details).
func (f *Filter) Split(ls Labels) (relevant, ignored Labels) {
	return ls.filter(f.Relevant), ls.filter(func(l Label) bool { return !f.Relevant(l) })
}

// IdentityLabels returns the identity-relevant labels of a set.
func (f *Filter) IdentityLabels(ls Labels) Labels {
	return ls.filter(f.Relevant)
}
