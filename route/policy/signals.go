package policy

import "github.com/turnout/turnout/route/fleet"

// What each stage and policy reads of an endpoint (fleet.Consumer): a
// leaf stage names the signals its methods read through their accessors,
// a composite the union of its parts'. Filter, Scorer, Tie, Picker,
// Recorder and fleet.Policy embed fleet.Consumer, so every one declares.
// Asked at config load (route's signal check, /readyz?verbose), never per
// decision. TestPolicySignals holds these to the accessor calls in the code.

// signalsOf is the union of what the given stages declare.
func signalsOf[T any](parts ...T) fleet.Signals {
	var s fleet.Signals
	for _, p := range parts {
		s |= fleet.SignalsOf(p)
	}
	return s
}

// Signals implements fleet.Consumer: every picker asks Cycle.Usable, the
// summary reads the loads (and the served counts), then the stages'.
func (pr *Profile) Signals() fleet.Signals {
	s := fleet.SignalSet(fleet.SignalAvailable)
	if pr.Summary.Load || pr.Summary.RequireAvailable {
		s |= fleet.SignalSet(fleet.SignalLoad)
		if pr.Summary.Served {
			s |= fleet.SignalSet(fleet.SignalServed)
		}
	}
	return s | signalsOf(pr.Pickers...) | signalsOf(pr.Recorders...)
}

// Signals implements fleet.Consumer.
func (m *MaxScore) Signals() fleet.Signals {
	s := fleet.SignalSet(fleet.SignalAvailable) | fleet.SignalsOf(m.Gate) | fleet.SignalsOf(m.Key) |
		signalsOf(m.Filters...) | signalsOf(m.Ties...)
	for _, w := range m.Scorers {
		s |= fleet.SignalsOf(w.Scorer)
	}
	return s
}

// Signals implements fleet.Consumer.
func (*Rotation) Signals() fleet.Signals { return fleet.SignalSet(fleet.SignalAvailable) }

// Signals implements fleet.Consumer.
func (*P2C) Signals() fleet.Signals {
	return fleet.SignalSet(fleet.SignalAvailable, fleet.SignalLoad)
}

// Signals implements fleet.Consumer.
func (*LeastLoaded) Signals() fleet.Signals {
	return fleet.SignalSet(fleet.SignalAvailable, fleet.SignalLoad, fleet.SignalRecent)
}

// Signals implements fleet.Consumer.
func (*Ring) Signals() fleet.Signals {
	return fleet.SignalSet(fleet.SignalAvailable, fleet.SignalLoad)
}

// Signals implements fleet.Consumer.
func (g *LoadGuard) Signals() fleet.Signals {
	s := fleet.SignalSet(fleet.SignalLoad)
	if g.Bounded > 0 {
		s |= fleet.SignalSet(fleet.SignalServed)
	}
	return s
}

// Signals implements fleet.Consumer.
func (*BoundedServed) Signals() fleet.Signals {
	return fleet.SignalSet(fleet.SignalLoad, fleet.SignalAdmits, fleet.SignalServed)
}

// Signals implements fleet.Consumer.
func (*LeastLoadedRecent) Signals() fleet.Signals {
	return fleet.SignalSet(fleet.SignalLoad, fleet.SignalRecent)
}

// Signals implements fleet.Consumer.
func (LoadScore) Signals() fleet.Signals { return fleet.SignalSet(fleet.SignalLoad) }

// Signals implements fleet.Consumer.
func (LowerLoad) Signals() fleet.Signals { return fleet.SignalSet(fleet.SignalLoad) }

// Signals implements fleet.Consumer.
func (FewerRecent) Signals() fleet.Signals { return fleet.SignalSet(fleet.SignalRecent) }

// Signals implements fleet.Consumer.
func (FewerServed) Signals() fleet.Signals { return fleet.SignalSet(fleet.SignalServed) }

// Signals implements fleet.Consumer.
func (SessionGate) Signals() fleet.Signals {
	return fleet.SignalSet(fleet.SignalAvailable, fleet.SignalLoad, fleet.SignalRecent)
}

// Signals implements fleet.Consumer.
func (EngineQueue) Signals() fleet.Signals {
	return fleet.SignalSet(fleet.SignalEngineQueue, fleet.SignalInflight)
}

// Signals implements fleet.Consumer.
func (*LoRAIndex) Signals() fleet.Signals { return fleet.SignalSet(fleet.SignalAdapters) }

// Signals implements fleet.Consumer.
func (f firstOnly) Signals() fleet.Signals { return fleet.SignalsOf(f.Picker) }

// Signals implements fleet.Consumer.
func (p *prefixMatched) Signals() fleet.Signals { return p.MaxScore.Signals() }

// Signals implements fleet.Consumer: with reclaim_admitted, whether a
// holder's engine would start the request at once.
func (g *ttftGuard) Signals() fleet.Signals {
	s := fleet.SignalSet(fleet.SignalAvailable, fleet.SignalLoad, fleet.SignalPending)
	if g.pt.cfg.ReclaimAdmitted {
		s |= fleet.SignalSet(fleet.SignalAdmits)
	}
	return s
}

// Signals implements fleet.Consumer.
func (rr *RoundRobin) Signals() fleet.Signals { return rr.rot.Signals() }

// Signals implements fleet.Consumer.
func (s *SessionHash) Signals() fleet.Signals { return s.session.Signals() | s.fallback.Signals() }

// Signals implements fleet.Consumer: its profile and its fallback's, the
// KV events its index is fed from and, unless params.block_size gives it,
// the engines' block size.
func (k *KVAware) Signals() fleet.Signals {
	s := k.profile.Signals() | k.fallback.Signals() | fleet.SignalSet(fleet.SignalKVEvents)
	if k.cfg.BlockSize <= 0 {
		s |= fleet.SignalSet(fleet.SignalKVBlockSize)
	}
	return s
}

// Signals implements fleet.Consumer: prefix-affinity's and the guard's
// stages, and what the model learns from (first-token times, the
// engines' TTFT histograms) and predicts with (load, queued prefill).
func (pt *PredictedTTFT) Signals() fleet.Signals {
	return pt.Profile.Signals() | fleet.SignalSet(fleet.SignalFirstToken, fleet.SignalEngineTTFT, fleet.SignalLoad, fleet.SignalPending)
}

// Signals implements fleet.Consumer: the index reads its own LRUs, no
// endpoint signal.
func (*PrefixIndex) Signals() fleet.Signals { return 0 }

// Signals implements fleet.Consumer: the cycle's KV matches are KVAware's
// (it declares the KV events).
func (kvUncached) Signals() fleet.Signals { return 0 }

// Signals implements fleet.Consumer: an endpoint's seed is no signal.
func (SessionRank) Signals() fleet.Signals { return 0 }

var _ fleet.Consumer = SessionGate{}
