package policy

import (
	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"
)

// EngineQueueStage is the registry name of EngineQueue.
const EngineQueueStage = "engine-queue"

// EngineQueue prefers replicas whose engine reported fewer requests at its
// last scrape: minus running + waiting (unit: requests). The scraper sums
// vLLM's running and waiting gauges into EngineLoad.Requests, so this is
// the engine's queue as the engine sees it, without the in-flight change
// since the scrape that LoadScore adds. Without a scrape it scores the
// in-flight decisions.
type EngineQueue struct{}

// NewEngineQueueScorer builds the scorer (no params).
func NewEngineQueueScorer(cfg *config.StageConfig, _ StageEnv) (Scorer, error) {
	var none struct{}
	return EngineQueue{}, cfg.DecodeParams(&none)
}

// Score implements Scorer.
func (EngineQueue) Score(_ *Cycle, e *fleet.Endpoint) float64 {
	if n, ok := e.EngineRequests(); ok {
		return -float64(n)
	}
	return -float64(e.Inflight())
}

var _ Scorer = EngineQueue{}
