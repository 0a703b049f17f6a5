package policy

import "github.com/turnout/turnout/route/fleet"

// Weighted is a scorer with its weight in a picker's sum.
type Weighted struct {
	Scorer Scorer
	Weight float64
}

// Keyer is the scorer a keyed picker places requests by (the prefix
// index): its key is a count of matched blocks out of Of, and endpoints
// without a match are not candidates at all.
type Keyer interface {
	// Match is how many of the request's blocks e holds.
	Match(c *Cycle, e *fleet.Endpoint) int
	// Of is the request's block count.
	Of(c *Cycle) int
}

// maxHolderWords bounds the holder bitset a keyed picker keeps on its
// stack (4,096 endpoints; a larger pool asks every endpoint).
const maxHolderWords = 64

// Gate decides whether a picker runs for this request at all.
type Gate interface {
	Open(c *Cycle) bool
}

// maxTies bounds a picker's tie-breakers (keys are cached on the stack).
const maxTies = 4

// MaxScore picks the endpoints with the highest weighted score, breaking
// ties with Ties and then by order (from a random rotation when Rand is
// set, so equal scores spread). It is the one ranking loop of every preset:
// the least-loaded fill, the prefix hit, the KV cost, the session tie-break.
type MaxScore struct {
	Name    string
	Gate    Gate     // nil: always runs
	Filters []Filter // besides Endpoint.Available
	Scorers []Weighted
	Ties    []Tie
	// Key, when set, makes the picker keyed: only endpoints with a match
	// are candidates, Accept judges the winner's match, and the winner's
	// match is the choice's Matched.
	Key Keyer
	// Accept is the least fraction of the request's blocks the winner
	// must hold (keyed pickers).
	Accept float64
	// Rand, when set, rotates the scan's start (one draw per run, even
	// when the choice is already full, as the fill always did).
	Rand *fleet.Rand
	// Slots is how many endpoints it picks (0: until the choice is full).
	Slots int
	// WhenEmpty: it runs only when nothing has been picked yet.
	WhenEmpty bool
	// Outcome is set when it runs (Overflow for a last-resort fill) or,
	// with OnPick, when it picks.
	Outcome             fleet.Outcome
	SetsOutcome, OnPick bool
	// Upgrade: an affinity outcome does not replace an overflow one (a
	// session tie-break after the key's replica was refused).
	Upgrade bool
}

// Pick implements Picker.
func (m *MaxScore) Pick(c *Cycle) {
	if (m.WhenEmpty && c.Picked() > 0) || (m.Gate != nil && !m.Gate.Open(c)) {
		return
	}
	eps, off := c.Rotated(m.Rand)
	n := len(eps)
	if n == 0 {
		return
	}
	if m.SetsOutcome && !m.OnPick {
		c.Choice.Outcome = m.Outcome
	}
	dst := c.Choice.Endpoints
	key, filters, scorers, ties := m.Key, m.Filters, m.Scorers, m.Ties
	of := 0
	var holders [maxHolderWords]uint64
	gated := false
	var px *PrefixIndex
	if key != nil {
		of = key.Of(c)
		// The prefix index names, once per request, the only endpoints
		// whose Match may be non-zero (a static call: the bitset stays on
		// the stack).
		if x, ok := key.(*PrefixIndex); ok {
			px = x
			gated = x.Holders(c, holders[:])
		}
	}
	for picked := 0; len(dst) < cap(dst) && (m.Slots == 0 || picked < m.Slots); picked++ {
		var best *fleet.Endpoint
		var bestScore float64
		bestMatch := 0
		var bestKeys [maxTies]uint64
		known := 0 // how many of bestKeys are computed
		for j := 0; j < n; j++ {
			i := j + off
			if i >= n {
				i -= n
			}
			e := eps[i]
			if !c.Usable(e) || fleet.Contains(dst, e) {
				continue
			}
			match := 0
			if key != nil {
				if gated && holders[e.Index>>6]&(1<<(e.Index&63)) == 0 {
					continue // holds no block of the prompt: Match would be 0
				}
				// The guards first: a refused endpoint's match is looked
				// up only while it can still change the outcome.
				if len(filters) > 0 && !keepAll(filters, c, e) {
					if c.Choice.Outcome != fleet.OutcomeOverflow {
						if m := matchAtLeast(key, px, c, e, (of+1)/2); m > 0 && m*2 >= of {
							// The replica holding most of the prompt is
							// refused by a guard: the request overflows
							// unless another replica honours its key.
							c.Choice.Outcome = fleet.OutcomeOverflow
						}
					}
					continue
				}
				// Without scorers the score is the match: only a match
				// of at least the best's can win or tie.
				floor := 1
				if best != nil && len(scorers) == 0 {
					floor = bestMatch
				}
				if match = matchAtLeast(key, px, c, e, floor); match == 0 {
					continue
				}
			} else if len(filters) > 0 && !keepAll(filters, c, e) {
				continue
			}
			// The weighted sum, in order from zero (the sum of negated
			// costs is then exactly the negated sum: presets rank as the
			// costs did). A keyed picker's key counts its matched blocks
			// (one request: the same ranking as the fraction held).
			var s float64
			if key != nil {
				s = float64(match)
			}
			for k := range scorers {
				s += scorers[k].Weight * score(scorers[k].Scorer, c, e)
			}
			if best != nil {
				if s < bestScore {
					continue
				}
				if s == bestScore {
					win := false
					for k, t := range ties {
						ke := tieKey(t, c, e)
						if k >= known {
							bestKeys[k] = tieKey(t, c, best)
							known = k + 1
						}
						if ke != bestKeys[k] {
							win = ke > bestKeys[k]
							if win {
								// e's keys so far are the new best's.
								bestKeys[k] = ke
								known = k + 1
							}
							break
						}
					}
					if !win {
						continue
					}
					best, bestScore, bestMatch = e, s, match
					continue
				}
			}
			best, bestScore, bestMatch, known = e, s, match, 0
		}
		if best == nil {
			break
		}
		if key != nil && float64(bestMatch) < m.Accept*float64(of) {
			break
		}
		first := len(dst) == c.start
		dst = append(dst, best)
		if first {
			if m.Key != nil {
				c.Choice.Matched = bestMatch
			}
			if m.SetsOutcome && m.OnPick && !(m.Upgrade && c.Choice.Outcome == fleet.OutcomeOverflow) {
				c.Choice.Outcome = m.Outcome
			}
		}
	}
	c.Choice.Endpoints = dst
}

// matchAtLeast is key.Match(c, e) when that is at least floor, and 0 or
// a figure below floor otherwise; px, key as the prefix index (else nil),
// then looks up fewer blocks.
func matchAtLeast(key Keyer, px *PrefixIndex, c *Cycle, e *fleet.Endpoint, floor int) int {
	if px != nil {
		return px.lrus[e.Index].matchAtLeast(c.Req.Blocks, floor)
	}
	return key.Match(c, e)
}

func keepAll(filters []Filter, c *Cycle, e *fleet.Endpoint) bool {
	for _, f := range filters {
		if !f.Keep(c, e) {
			return false
		}
	}
	return true
}

// score and tieKey call the built-in stages directly (a static, inlined
// call instead of an indirect one: the ranking loop runs per endpoint and
// per slot) and any other through its interface.
func score(sc Scorer, c *Cycle, e *fleet.Endpoint) float64 {
	if ls, ok := sc.(LoadScore); ok {
		return ls.Score(c, e)
	}
	return sc.Score(c, e)
}

func tieKey(t Tie, c *Cycle, e *fleet.Endpoint) uint64 {
	switch t := t.(type) {
	case LowerLoad:
		return t.Key(c, e)
	case FewerRecent:
		return t.Key(c, e)
	}
	return t.Key(c, e)
}

var _ Picker = (*MaxScore)(nil)
