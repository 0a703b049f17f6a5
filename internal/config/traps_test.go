package config

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// A bare number in a duration field is refused with the unit spelt out
// ("interval: 5" used to mean 5 ms); 0 and values with units still load.
func TestDurationNeedsUnit(t *testing.T) {
	for _, v := range []string{"5", "2.5", "'5'"} {
		_, err := ParseConfig([]byte("health: {interval: " + v + "}\n" + fourEndpoints0()))
		var ce *ConfigError
		if !errors.As(err, &ce) || len(ce.Problems) != 1 {
			t.Fatalf("interval: %s: err = %v", v, err)
		}
		p := ce.Problems[0]
		if p.Path != "health.interval" || p.Line != 1 || !strings.Contains(p.Msg, "no unit") || !strings.Contains(p.Msg, "s (seconds)") {
			t.Errorf("interval: %s: %+v", v, p)
		}
	}
	c := mustParse(t, "health: {interval: 5s, timeout: 250ms}\ncluster: {batch_delay: 0}\n"+fourEndpoints0())
	if c.Health.Interval.D() != 5*time.Second || c.Health.Timeout.D() != 250*time.Millisecond || c.Cluster.BatchDelay.D() != 5*time.Millisecond {
		t.Errorf("durations: %v %v %v", c.Health.Interval.D(), c.Health.Timeout.D(), c.Cluster.BatchDelay.D())
	}
}

// Problems of every stage come back together: a field that does not decode,
// a value validation refuses, and what a caller's check finds (serve and
// render pass the policy factories), in file order.
func TestConfigProblemsAllAtOnce(t *testing.T) {
	y := `fallbacks: 20
health: {interval: 5, bogus: 1}
deployments:
  - name: a
    policy: {name: nope}
    pools: [{endpoints: [{name: a, address: 127.0.0.1:1}]}]
`
	check := func(c *Config) error {
		if c.Deployments[0].Policy.Name == "nope" {
			return &FieldError{Path: "deployments[0].policy.name", Msg: "unknown policy"}
		}
		return nil
	}
	_, err := ParseConfig([]byte(y), check)
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v", err)
	}
	var got []string
	for _, p := range ce.Problems {
		got = append(got, p.Path)
	}
	want := []string{"fallbacks", "health.interval", "health.bogus", "deployments[0].policy.name"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("problems %q, want %q\n%v", got, want, err)
	}
	if ce.Problems[3].Line != 5 {
		t.Errorf("policy problem line %d, want 5", ce.Problems[3].Line)
	}
}
