package route

import "strings"

// LoadAware is implemented by policies whose choice reads endpoints'
// in-flight counts, which fall only when completions are fed back.
type LoadAware interface {
	LoadAware() bool
}

// LoadAware implements LoadAware.
func (*LeastRequest) LoadAware() bool { return true }

// LoadAware implements LoadAware: the balance guard reads in-flight counts.
func (*PrefixAffinity) LoadAware() bool { return true }

// LoadAware implements LoadAware: the cost adds in-flight counts.
func (*KVAware) LoadAware() bool { return true }

// LoadAware implements LoadAware: the bound on loads moves sessions.
func (*SessionHash) LoadAware() bool { return true }

var (
	_ LoadAware = (*LeastRequest)(nil)
	_ LoadAware = (*PrefixAffinity)(nil)
	_ LoadAware = (*KVAware)(nil)
	_ LoadAware = (*SessionHash)(nil)
)

// warnFeedbackOff logs, for a config with feedback turned off, the pools
// whose policy would drift for want of completions.
func (s *Server) warnFeedbackOff(snap *Snapshot) {
	if snap.Config.Feedback.Syslog != "" {
		return
	}
	var pools []string
	for _, p := range snap.Pools() {
		if la, ok := p.Policy.(LoadAware); ok && la.LoadAware() {
			pools = append(pools, p.Name+" ("+p.PolicyName+")")
		}
	}
	if len(pools) == 0 {
		return
	}
	s.log.Warn().Str("pools", strings.Join(pools, ", ")).Str(fieldReason, "feedback disabled").
		Msg("completion feedback is off but these pools balance on in-flight counts: decisions never complete, counts only grow until decision_ttl and the policy drifts; remove feedback.disable")
}
