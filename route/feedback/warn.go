package feedback

import (
	"strings"

	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/fleet"
)

// warnFeedbackOff logs, for a config with feedback turned off, the pools
// whose policy would drift for want of completions.
func (l *Loop) warnFeedbackOff(snap *route.Snapshot) {
	if snap.Config.Feedback.Syslog != "" {
		return
	}
	var pools []string
	for _, p := range snap.Pools() {
		if la, ok := p.Policy.(fleet.LoadAware); ok && la.LoadAware() {
			pools = append(pools, p.Name+" ("+p.PolicyName+")")
		}
	}
	if len(pools) == 0 {
		return
	}
	l.log.Warn().Str("pools", strings.Join(pools, ", ")).Str(fleet.FieldReason, "feedback disabled").
		Msg("completion feedback is off but these pools balance on in-flight counts: decisions never complete, counts only grow until decision_ttl and the policy drifts; remove feedback.disable")
}
