package policy

import (
	"testing"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"
)

// ReadsPrompt agrees with the policies themselves: a built policy that
// hashes the prompt's blocks (fleet.PromptUser), or KV-aware (token ids),
// reads the prompt; the others do not. A composed policy reads it when it
// has a prefix scorer.
func TestReadsPromptMatchesPolicies(t *testing.T) {
	reg := DefaultRegistry()
	for _, name := range reg.Names() {
		pol, err := reg.Build(&config.PolicyConfig{Name: name}, fleet.PolicyEnv{Pool: goldenPool(2), Rand: fleet.NewRand(1)})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		_, prompt := pol.(fleet.PromptUser)
		_, kv := pol.(*KVAware)
		if got := ReadsPrompt(&config.PolicyConfig{Name: name}); got != (prompt || kv) {
			t.Errorf("ReadsPrompt(%s) = %v, the policy uses the prompt: %v", name, got, prompt || kv)
		}
		if c, ok := pol.(fleet.Closer); ok {
			c.Close()
		}
	}
	for _, tc := range []struct {
		scorers []string
		want    bool
	}{{[]string{LoadStage}, false}, {[]string{LoadStage, PrefixStage}, true}, {[]string{EngineQueueStage}, false}} {
		st := &config.StagesConfig{}
		for _, s := range tc.scorers {
			st.Scorers = append(st.Scorers, config.StageConfig{Name: s})
		}
		if got := ReadsPrompt(&config.PolicyConfig{Name: "custom", Stages: st}); got != tc.want {
			t.Errorf("stages %v: ReadsPrompt %v, want %v", tc.scorers, got, tc.want)
		}
	}
}
