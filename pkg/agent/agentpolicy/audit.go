package agentpolicy

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	policyk8s "github.com/tendril-net/tendril/pkg/policy/k8s"
)

// AuditedRule is what audited-connection counts are reported under: the
// policy object a rule came from (kind, namespace, name; "api" and the
// empty name for rules imported through the API) and the rule's cookie.
type AuditedRule struct {
	Kind, Namespace, Name string
	Cookie                uint32
}

// AuditCounts reads the datapath's per-rule counts of connections audited
// policies would have denied (since the agent started: the counters are
// cleared at start, as rule cookies are renumbered) and names their rules.
// A cookie no current rule has (a rule removed since) is reported under
// its number alone.
func (p *Module) AuditCounts() (map[AuditedRule]uint64, error) {
	if p.dp == nil || p.dp.Maps() == nil {
		return nil, nil
	}
	counts, err := p.dp.Maps().AuditMap().Dump()
	if err != nil || len(counts) == 0 {
		return nil, err
	}
	rules, _ := p.repo.Rules(nil)
	byCookie := map[uint32]AuditedRule{}
	for _, s := range rules {
		r := AuditedRule{Kind: "api", Cookie: s.ID}
		for _, l := range s.Rule.Labels {
			switch l.Key {
			case policyk8s.KeyPolicyDerivedFrom:
				r.Kind = l.Value
			case policyk8s.KeyPolicyNamespace:
				r.Namespace = l.Value
			case policyk8s.KeyPolicyName:
				r.Name = l.Value
			}
		}
		byCookie[s.ID] = r
	}
	out := make(map[AuditedRule]uint64, len(counts))
	for cookie, n := range counts {
		r, ok := byCookie[cookie]
		if !ok {
			r = AuditedRule{Cookie: cookie}
		}
		out[r] += n
	}
	return out, nil
}

// clearAuditCounts empties the counters: a new start numbers rules anew.
func (p *Module) clearAuditCounts() error {
	if p.dp == nil || p.dp.Maps() == nil {
		return nil
	}
	return p.dp.Maps().AuditMap().Clear()
}

// auditCollector exports the audit counts per policy and rule.
type auditCollector struct {
	p    *Module
	desc *prometheus.Desc
}

func newAuditCollector(p *Module) *auditCollector {
	return &auditCollector{p: p, desc: prometheus.NewDesc("tendril_policy_audited_connections_total",
		"Connections an audited policy would have denied and let pass, by policy object and rule (cookie), since the agent started.",
		[]string{"kind", "namespace", "name", "rule"}, nil)}
}

func (c *auditCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *auditCollector) Collect(ch chan<- prometheus.Metric) {
	counts, err := c.p.AuditCounts()
	if err != nil {
		c.p.log.Debug("Read audit counters", "error", err)
		return
	}
	for r, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(n), r.Kind, r.Namespace, r.Name, strconv.FormatUint(uint64(r.Cookie), 10))
	}
}
