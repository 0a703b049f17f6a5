package bench

import (
	"context"
	"fmt"

	"github.com/turnout/turnout/route/contract"
)

// Turnout's own time per decision, beside the client's: its
// turnout_decision_duration_seconds histogram (one decision in 8 timed,
// from the request reaching the handler to the pick; neither the HTTP
// parse before nor the answer's write after), read from its /metrics
// before and after a run. The difference is the run's.

// decisionTimeFamily is the histogram the rows read.
const decisionTimeFamily = "turnout_decision_duration_seconds"

// decisionBuckets reads the decision time histogram of the turnout
// listening on addr, summed over its pools.
func decisionBuckets(ctx context.Context, addr string) (Buckets, error) {
	text, err := getText(ctx, "http://"+addr+contract.PathMetrics)
	if err != nil {
		return nil, fmt.Errorf("decision time: %w", err)
	}
	return HistBuckets(ParseProm(text), decisionTimeFamily, "", ""), nil
}
