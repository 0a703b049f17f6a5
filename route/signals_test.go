package route

import (
	"strings"
	"testing"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/policy"
)

// signalCfg is a config of one deployment with the policy and extra lines
// (top level, and per endpoint) given.
func signalCfg(top, pol, ep string) string {
	return top + `
deployments:
  - name: d
    models: [m]
    policy: ` + pol + `
    pools:
      - endpoints:
          - {name: e0, address: 127.0.0.1:9001` + ep + `}
          - {name: e1, address: 127.0.0.1:9002` + ep + `}
`
}

// signalWarned lists the signals the config check warns about, by the
// warnings' paths and messages.
func signalWarned(t *testing.T, y string) (signals []string, msgs []string) {
	t.Helper()
	c, err := config.ParseConfig([]byte(y), func(c *config.Config) error { return CheckPolicies(c, policy.DefaultRegistry()) })
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	for _, w := range c.Warnings() {
		_, rest, ok := strings.Cut(w.Msg, "reads the signal ")
		if !ok {
			continue
		}
		if w.Path != "deployments[0].policy" || w.Line == 0 {
			t.Errorf("warning at %q line %d: %s", w.Path, w.Line, w.Msg)
		}
		name, _, _ := strings.Cut(rest, ",")
		signals = append(signals, name)
		msgs = append(msgs, w.Msg)
	}
	return signals, msgs
}

// A policy reading a signal that nothing configured feeds is a config
// warning at its policy's line; the same policy with the producer on is
// not.
func TestSignalWarnings(t *testing.T) {
	for _, tc := range []struct {
		name, top, pol, ep string
		want               string
	}{
		{"kv-aware without KV events", "", "{name: kv-aware}", "", "kv_events"},
		{"kv-aware with an endpoint's kv_events", "", "{name: kv-aware}", ", kv_events: 'tcp://127.0.0.1:5557'", ""},
		{"kv-aware fed by a bind address", "kv_events_bind: 'tcp://127.0.0.1:5557'", "{name: kv-aware}", "", ""},
		{"kv-aware without engine metrics", "engine_metrics: {disable: true}", "{name: kv-aware}", ", kv_events: 'tcp://127.0.0.1:5557'",
			"recent,served,admits,kv_block_size"},
		{"kv-aware given its block size", "engine_metrics: {disable: true}", "{name: kv-aware, params: {block_size: 16}}", ", kv_events: 'tcp://127.0.0.1:5557'",
			"recent,served,admits"},
		{"predicted-ttft with engine metrics and first tokens", "", "{name: predicted-ttft}", "", ""},
		{"predicted-ttft without engine metrics", "engine_metrics: {disable: true}", "{name: predicted-ttft}", "",
			"recent,served,admits,engine_ttft"},
		{"predicted-ttft without first-token times", "proxy: {first_token_timing: false}", "{name: predicted-ttft}", "", "first_token"},
		{"predicted-ttft with nothing", "engine_metrics: {disable: true}\nfeedback: {disable: true}", "{name: predicted-ttft}", "",
			"load,pending,recent,served,admits,engine_ttft,first_token"},
		{"least-request without feedback, scraped", "feedback: {disable: true}", "{name: least-request}", "", ""},
		{"least-request with nothing", "engine_metrics: {disable: true}\nfeedback: {disable: true}", "{name: least-request}", "", "load,recent"},
		{"lora-affinity without engine metrics", "engine_metrics: {disable: true}", "{name: lora-affinity}", "", "recent,adapters"},
		{"round-robin with nothing", "engine_metrics: {disable: true}\nfeedback: {disable: true}\nhealth: {disable: true}", "{name: round-robin}", "", ""},
		{"a composed engine-queue without engine metrics", "engine_metrics: {disable: true}", "{stages: {scorers: [{name: engine-queue}]}}", "",
			"recent,engine_queue"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, msgs := signalWarned(t, signalCfg(tc.top, tc.pol, tc.ep))
			if strings.Join(got, ",") != tc.want {
				t.Errorf("warned about %q, want %q:\n%s", strings.Join(got, ","), tc.want, strings.Join(msgs, "\n"))
			}
		})
	}
	_, msgs := signalWarned(t, signalCfg("", "{name: kv-aware}", ""))
	if len(msgs) != 1 || !strings.Contains(msgs[0], "policy kv-aware of pool d_mixed") || !strings.Contains(msgs[0], "kv_events_bind") {
		t.Errorf("kv-aware's warning does not name the policy, the pool and the config that feeds it: %q", msgs)
	}
}

// /readyz?verbose names, per pool, each signal its policy reads and what
// feeds it: the live endpoints' KV sources count.
func TestSignalsReadiness(t *testing.T) {
	d := mustServer(t, signalCfg("engine_metrics: {disable: true}", "{name: kv-aware}", ", kv_events: 'tcp://127.0.0.1:5557'"))
	defer d.Close()
	var b strings.Builder
	d.Extras().WriteReadinessNotes(&b)
	var line string
	for l := range strings.Lines(b.String()) {
		if strings.HasPrefix(l, "signals pool d_mixed (kv-aware):") {
			line = l
		}
	}
	for _, want := range []string{" available<-feedback+health,", " load<-decisions+feedback,", " kv_events<-kv_events", " recent<-none,", " kv_block_size<-none"} {
		if !strings.Contains(line, want) {
			t.Errorf("readiness line %q lacks %q (notes:\n%s)", line, want, b.String())
		}
	}
}
