package policy

import (
	"slices"

	"github.com/turnout/turnout/internal/config"
)

// ReadsPrompt reports whether the policy pc configures decides on the
// request's prompt (its text, length or token ids). Only a proxy that
// passes the body gives turnout the prompt (nginx header mode does not);
// without it such a policy balances by load alone. `turnout check` warns
// on that combination.
func ReadsPrompt(pc *config.PolicyConfig) bool {
	if pc.Stages != nil {
		return slices.ContainsFunc(pc.Stages.Scorers, func(s config.StageConfig) bool { return s.Name == PrefixStage })
	}
	switch pc.Name {
	case PrefixAffinityType, KVAwareType, PredictedTTFTType:
		return true
	case LoRAAffinityType:
		// A bad params block fails the build, which says why.
		cfg := DefaultLoRAAffinityConfig()
		return pc.DecodeParams(&cfg) == nil && cfg.PrefixWeight > 0
	}
	return false
}
