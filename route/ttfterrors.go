package route

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/turnout/turnout/route/estimator"
	"github.com/turnout/turnout/route/fleet"
)

// How far a TTFT-predicting policy's predictions were from what it
// learned from, per deployment and pool: two histogram families on
// /metrics (absolute in seconds, relative), each written once across the
// pools, and one /readyz?verbose line per such pool with the medians.

// ttftErrorReporter is implemented by policies that predict each
// decision's time to first token (predicted-ttft).
type ttftErrorReporter interface {
	PredictionErrors() *estimator.Errors
}

// ttftErrorPools are the snapshot's pools whose policy reports prediction
// errors, with them.
func ttftErrorPools(snap *Snapshot) (pools []*fleet.Pool, errs []*estimator.Errors) {
	for _, p := range snap.Pools() {
		if r, ok := p.Policy.(ttftErrorReporter); ok {
			pools, errs = append(pools, p), append(errs, r.PredictionErrors())
		}
	}
	return pools, errs
}

// writeTTFTErrorMetrics writes turnout_ttft_prediction_error_seconds and
// turnout_ttft_prediction_error_ratio (nothing when no pool predicts).
func writeTTFTErrorMetrics(b *strings.Builder, snap *Snapshot, help func(name, typ, text string)) {
	pools, errs := ttftErrorPools(snap)
	if len(pools) == 0 {
		return
	}
	help("turnout_ttft_prediction_error_seconds", "histogram", "|predicted - observed| time to first token of predicted-ttft's decisions, by what the model learned from: source first_token (one request's first body bytes, the feedback's tft) or engine (an engine's mean over a scrape interval).")
	for i, p := range pools {
		for src := range estimator.NumSources {
			h := &errs[i].Abs[src]
			writeErrorHistogram(b, "turnout_ttft_prediction_error_seconds", p, src, h.Counts[:], estimator.AbsErrorBucketsMs[:], 1e-3, float64(h.SumMicros.Load())/1e6)
		}
	}
	help("turnout_ttft_prediction_error_ratio", "histogram", "|predicted - observed| / observed time to first token of predicted-ttft's decisions, by source as turnout_ttft_prediction_error_seconds.")
	for i, p := range pools {
		for src := range estimator.NumSources {
			h := &errs[i].Rel[src]
			writeErrorHistogram(b, "turnout_ttft_prediction_error_ratio", p, src, h.Counts[:], estimator.ErrorBuckets[:], 1, float64(h.SumMicros.Load())/1e6)
		}
	}
}

// writeErrorHistogram writes one series of a histogram family; bounds are
// scaled by scale into the family's unit.
func writeErrorHistogram(b *strings.Builder, name string, p *fleet.Pool, src estimator.Source, counts []atomic.Uint64, bounds []float64, scale, sum float64) {
	var cum uint64
	for i := range counts {
		cum += counts[i].Load()
		le := "+Inf"
		if i < len(bounds) {
			le = strconv.FormatFloat(bounds[i]*scale, 'g', -1, 64)
		}
		fmt.Fprintf(b, "%s_bucket{deployment=%q,pool=%q,source=%q,le=%q} %d\n", name, p.Deployment, p.Name, src, le, cum)
	}
	fmt.Fprintf(b, "%s_sum{deployment=%q,pool=%q,source=%q} %g\n", name, p.Deployment, p.Name, src, sum)
	fmt.Fprintf(b, "%s_count{deployment=%q,pool=%q,source=%q} %d\n", name, p.Deployment, p.Name, src, cum)
}

// writeTTFTErrorReadiness writes one /readyz?verbose line per predicting
// pool: per source, how many predictions were checked and their median
// absolute and relative errors (interpolated in the histograms' buckets).
func writeTTFTErrorReadiness(b *strings.Builder, snap *Snapshot) {
	pools, errs := ttftErrorPools(snap)
	for i, p := range pools {
		fmt.Fprintf(b, "ttft prediction deployment %s pool %s:", p.Deployment, p.Name)
		for src := range estimator.NumSources {
			if src > 0 {
				b.WriteByte(';')
			}
			n := errs[i].Count(src)
			fmt.Fprintf(b, " %s %d samples", src, n)
			if n > 0 {
				fmt.Fprintf(b, ", median error %s ms, %s relative",
					fmtMedian(errs[i].Abs[src].Median(), 0), fmtMedian(errs[i].Rel[src].Median(), 2))
			}
		}
		b.WriteByte('\n')
	}
}

func fmtMedian(v float64, prec int) string {
	if math.IsNaN(v) {
		return "-"
	}
	return strconv.FormatFloat(v, 'f', prec, 64)
}
