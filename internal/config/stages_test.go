package config

import (
	"strings"
	"testing"
)

func TestPresets(t *testing.T) {
	const base = `
presets:
  - name: mine
    stages:
      scorers: [{name: load, weight: 2}]
deployments:
  - name: d
    policy: POLICY
    pools:
      - endpoints: [{name: e0, address: 127.0.0.1:8000}]
        policy: POOL
`
	parse := func(policy, pool string) (*Config, error) {
		return ParseConfig([]byte(strings.NewReplacer("POLICY", policy, "POOL", pool).Replace(base)))
	}
	c, err := parse("{name: mine}", "{stages: {scorers: [{name: prefix}], fallbacks: score}}")
	if err != nil {
		t.Fatal(err)
	}
	d := &c.Deployments[0]
	if d.Policy.Stages != &c.Presets[0].Stages || d.Policy.Stages.Scorers[0].W() != 2 {
		t.Fatalf("deployment policy not resolved to the preset: %+v", d.Policy)
	}
	if p := d.PoolPolicy(&d.Pools[0]); p.Name != CustomPolicy || p.Stages.Fallbacks != FallbacksScore || p.Stages.Scorers[0].W() != 1 {
		t.Fatalf("inline pool stages: %+v", p)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("validating again: %v", err)
	}
	for _, tc := range []struct{ policy, pool, want string }{
		{"{name: mine, params: {a: 1}}", "null", "line 8: deployments[0].policy.params: policy \"mine\" is a preset: its params are in its stages"},
		{"{name: mine, stages: {scorers: [{name: load}]}}", "null", "line 8: deployments[0].policy.stages: policy \"mine\" is a preset: its stages are in presets"},
		{"{stages: {scorers: [{name: load, weight: .nan}]}}", "null", "deployments[0].policy.stages.scorers[0].weight: NaN out of range"},
		{"{name: least-request}", "{stages: {filters: [{name: load-guard, weight: 1}], scorers: [{name: load}]}}", "line 11: deployments[0].pools[0].policy.stages.filters[0].weight: filters have no weight (scorers do)"},
		{"{stages: {scorers: [{weight: 1}]}}", "null", "deployments[0].policy.stages.scorers[0].name: required"},
	} {
		if _, err := parse(tc.policy, tc.pool); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("policy %s pool %s: error %v, want %q", tc.policy, tc.pool, err, tc.want)
		}
	}
	if _, err := ParseConfig([]byte(strings.Replace(strings.NewReplacer("POLICY", "{name: mine}", "POOL", "null").Replace(base), "presets:", "presets:\n  - {name: mine, stages: {scorers: [{name: load}]}}", 1))); err == nil || !strings.Contains(err.Error(), `presets[1].name: "mine" is used twice`) {
		t.Errorf("duplicate preset: %v", err)
	}
}
