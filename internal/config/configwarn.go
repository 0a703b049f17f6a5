package config

import (
	"fmt"
	"strings"
)

// maxNameLen is the longest deployment or endpoint name: names become
// HAProxy server/backend and nginx upstream identifiers, kept to one DNS
// label's length so every proxy and log field takes them.
const maxNameLen = 63

// nameProblem explains why name is not a usable proxy identifier.
func nameProblem(name string) string {
	if len(name) > maxNameLen {
		return fmt.Sprintf("%q is %d characters; names are limited to %d (they become HAProxy server and nginx upstream names)", name, len(name), maxNameLen)
	}
	return fmt.Sprintf("%q must start with a letter or digit and contain only letters, digits, '_', '.' and '-' (it becomes a proxy identifier)", name)
}

// Warnings lists what the config accepts but an operator probably did not
// mean (the same replica twice, a pool that can never answer), with paths and
// lines; turnout serve and render log them.
func (c *Config) Warnings() []*FieldError { return c.warnings }

// AddWarning records a warning found by one of ParseConfig's checks (a
// policy reading a signal nothing configured feeds): it is reported with
// the config's own warnings, with its line.
func (c *Config) AddWarning(w *FieldError) { c.warnings = append(c.warnings, w) }

func (c *Config) checkWarnings() []*FieldError {
	var out []*FieldError
	seen := map[string]string{} // address -> path of its first endpoint
	if m := &c.EngineMetrics; m.Share != nil && *m.Share && !c.Cluster.Enabled() {
		out = append(out, &FieldError{Path: "engine_metrics.share", Msg: "does nothing without cluster.nats: the fronts split the scrapes over cluster sync; alone, this instance scrapes every replica"})
	}
	for i := range c.Deployments {
		d := &c.Deployments[i]
		if d.FlowControl != nil && c.Feedback.Disable {
			out = append(out, &FieldError{Path: fmt.Sprintf("deployments[%d].flow_control", i), Msg: "feedback is disabled: held requests are released only as engine scrapes show room, and turnout's in-flight counts fall only at decision_ttl"})
		}
		if l := &d.LoRA; l.LoadOnDemand && len(l.Allow) == 0 && len(l.AdapterPaths) == 0 && !(l.LoadPatterns && len(l.Adapters) > 0) {
			out = append(out, &FieldError{Path: fmt.Sprintf("deployments[%d].lora.load_on_demand", i), Msg: "loads nothing: list the names it may load in lora.allow or lora.adapter_paths (or set lora.load_patterns to load any name matching lora.adapters)"})
		}
		for j := range d.Pools {
			p := &d.Pools[j]
			pf := fmt.Sprintf("deployments[%d].pools[%d]", i, j)
			if len(p.Endpoints) == 0 && p.Discovery == nil { // discovery fills it at run time
				out = append(out, &FieldError{Path: pf + ".endpoints", Msg: fmt.Sprintf(
					"pool %s has no endpoints: requests for %s get 503 until endpoints are added", PoolName(d.Name, p.Role), strings.Join(d.Models, ", "))})
			}
			for k := range p.Endpoints {
				e := &p.Endpoints[k]
				ef := fmt.Sprintf("%s.endpoints[%d]", pf, k)
				if first, ok := seen[e.Address]; ok {
					out = append(out, &FieldError{Path: ef + ".address", Msg: fmt.Sprintf(
						"%s is also the address of %s: one replica listed twice gets twice its share and its load is split between two names", e.Address, first)})
					continue
				}
				seen[e.Address] = ef
			}
		}
	}
	return out
}
