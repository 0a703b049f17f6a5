package policy

import (
	"github.com/turnout/turnout/route/estimator"
	"github.com/turnout/turnout/route/fleet"
)

// ttftCand is one endpoint's prediction for the cycle's request.
type ttftCand struct {
	e             *fleet.Endpoint
	x             estimator.Features
	pred          float64
	load, pending int64
	uncached      int
	match         int
}

// meetObjective picks for a request with a TTFT objective of obj ms
// (fleet.Request.TTFTObjectiveMs) instead of the margins: prefix-affinity's
// pick def when it is predicted to meet the objective and no endpoint
// holding more of the prompt is; else, among the endpoints predicted to
// meet it, the one holding the most of the prompt (a cache hit first),
// the lowest prediction among equals; when none is, the endpoint with
// the lowest prediction (its prediction, above the objective, is what
// flow control sheds a shedding class's request on).
func (pt *PredictedTTFT) meetObjective(c *Cycle, obj float64, def ttftCand) ttftCand {
	if def.match > 0 && def.pred <= obj && def.match >= len(c.Req.Blocks) {
		return def // the whole prompt held, in time: nothing can beat it
	}
	meet, fastest := ttftCand{}, def
	if def.pred <= obj {
		meet = def
	}
	for _, e := range c.Candidates() {
		if e == def.e || !c.Usable(e) {
			continue
		}
		match := pt.idx.lrus[e.Index].matchLen(c.Req.Blocks)
		if meet.e != nil && match < meet.match {
			continue // cannot replace the meeting pick, nor be the fastest while one meets
		}
		x, load, pending, uncached := pt.features(c, e, match)
		cand := ttftCand{e: e, x: x, pred: pt.models[e.Index].Predict(&x), load: load, pending: pending, uncached: uncached, match: match}
		if cand.pred < fastest.pred || cand.pred == fastest.pred && load < fastest.load {
			fastest = cand
		}
		if cand.pred > obj {
			continue
		}
		// def keeps ties: prefix-affinity's pick also weighed the load.
		if meet.e == nil || match > meet.match || match == meet.match && meet.e != def.e && cand.pred < meet.pred {
			meet = cand
		}
	}
	if meet.e != nil {
		return meet
	}
	return fastest
}
