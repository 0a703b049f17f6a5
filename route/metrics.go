package route

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"github.com/turnout/turnout/internal/promtext"
	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/estimator"
	"github.com/turnout/turnout/route/fleet"
)

// Metrics are hand-rolled atomic counters rendered in Prometheus text format:
// the hot path only does atomic adds into fixed arrays (no label maps, no
// allocation), and the scrape path is rare enough to format freely.

type deciderMetrics struct {
	reloads      atomic.Uint64
	reloadFailed atomic.Uint64
	pdPrefill    [5]atomic.Uint64 // ok, retried, failed, skipped, aggregated
}

// WriteMetrics renders all metrics.
func (d *Decider) WriteMetrics(b *strings.Builder) {
	snap := d.snap.Load()
	help := promtext.Helper(b)
	help("turnout_decisions_total", "counter", "Routing decisions by deployment, pool, policy and outcome.")
	for _, p := range snap.Pools() {
		for o := fleet.Outcome(0); o < fleet.NumOutcomes; o++ {
			fmt.Fprintf(b, "turnout_decisions_total{deployment=%q,pool=%q,policy=%q,outcome=%q} %d\n",
				p.Deployment, p.Name, p.PolicyName, o.String(), p.Metrics.Outcomes[o].Load())
		}
	}
	help("turnout_decision_duration_seconds", "histogram", "Time to decide, per pool (one decision in 8 is timed: an unbiased sample; count the decisions with turnout_decisions_total).")
	for _, p := range snap.Pools() {
		h := &p.Metrics.Latency
		promtext.Histogram(b, "turnout_decision_duration_seconds", fmt.Sprintf("deployment=%q,pool=%q", p.Deployment, p.Name),
			fleet.LatencyBuckets[:], 1, h.Counts[:], float64(h.SumNs.Load())/1e9)
	}
	// Every pool, 0 without a prefix policy: a dashboard reads 0, not nothing.
	for _, f := range [...]struct {
		name, help string
		v          func(*fleet.PoolMetrics) uint64
	}{
		{"turnout_prefix_blocks_total", "Prompt blocks seen by prefix policies.", func(m *fleet.PoolMetrics) uint64 { return m.TotalBlocks.Load() }},
		{"turnout_prefix_matched_blocks_total", "Prompt blocks routed to a replica that was sent them before.", func(m *fleet.PoolMetrics) uint64 { return m.MatchedBlocks.Load() }},
		{"turnout_prefix_short_prompts_total", "Prompts shorter than one block (the policy's block_bytes): nothing for a prefix policy to match; lower block_bytes for short system prompts.", func(m *fleet.PoolMetrics) uint64 { return m.ShortPrompts.Load() }},
	} {
		help(f.name, "counter", f.help)
		for _, p := range snap.Pools() {
			fmt.Fprintf(b, "%s{deployment=%q,pool=%q} %d\n", f.name, p.Deployment, p.Name, f.v(p.Metrics))
		}
	}
	help("turnout_endpoint_inflight", "gauge", "Decisions sent to an endpoint and not yet completed.")
	for _, p := range snap.Pools() {
		for _, e := range p.Endpoints {
			fmt.Fprintf(b, "turnout_endpoint_inflight{deployment=%q,pool=%q,endpoint=%q} %d\n", p.Deployment, p.Name, e.Name, e.Inflight())
		}
	}
	help("turnout_endpoint_up", "gauge", "1 when the endpoint is available.")
	fleet.WriteEndpointSeries(b, snap.Pools(), "turnout_endpoint_up", func(e *fleet.Endpoint) float64 { return fleet.Flag(e.Available()) })
	help("turnout_pool_ready_endpoints", "gauge", "Endpoints available in the pool (0 also for a pool with none: discovery found nothing).")
	for _, p := range snap.Pools() {
		ready := 0
		for _, e := range p.Endpoints {
			if e.Available() {
				ready++
			}
		}
		fmt.Fprintf(b, "turnout_pool_ready_endpoints{deployment=%q,pool=%q} %d\n", p.Deployment, p.Name, ready)
	}
	writeReadinessMetrics(b, snap, d.health.HealthRounded())
	help("turnout_endpoint_decisions_total", "counter", "Decisions per endpoint.")
	for _, p := range snap.Pools() {
		for _, e := range p.Endpoints {
			fmt.Fprintf(b, "turnout_endpoint_decisions_total{deployment=%q,pool=%q,endpoint=%q} %d\n", p.Deployment, p.Name, e.Name, e.State.Decisions.Load())
		}
	}
	help("turnout_completions_total", "counter", "Completion signals by result.")
	for _, c := range []struct {
		name string
		v    uint64
	}{
		{"completed", d.dec.completed.Load()},
		{"unknown", d.dec.unknown.Load()},
		{"duplicate", d.dec.duplicate.Load()},
		{"expired", d.dec.expired.Load()},
		{"overwritten", d.dec.overwritten.Load()},
		{"reconciled", d.dec.reconciled.Load()},
		{"abandoned", d.dec.abandoned.Load()},
	} {
		fmt.Fprintf(b, "turnout_completions_total{result=%q} %d\n", c.name, c.v)
	}
	d.ref.write(b)
	help("turnout_config_reloads_total", "counter", "Config snapshots applied or rejected.")
	fmt.Fprintf(b, "turnout_config_reloads_total{result=\"ok\"} %d\n", d.m.reloads.Load())
	fmt.Fprintf(b, "turnout_config_reloads_total{result=\"rejected\"} %d\n", d.m.reloadFailed.Load())
	help("turnout_health_checks_total", "counter", "Active health checks by result.")
	fmt.Fprintf(b, "turnout_health_checks_total{result=\"ok\"} %d\n", d.health.checks[0].Load())
	fmt.Fprintf(b, "turnout_health_checks_total{result=\"fail\"} %d\n", d.health.checks[1].Load())
	help("turnout_pd_prefill_total", "counter", "Prefill calls made for prefill/decode deployments.")
	for i, n := range []string{"ok", "retried", "failed", "skipped", "aggregated"} {
		fmt.Fprintf(b, "turnout_pd_prefill_total{result=%q} %d\n", n, d.m.pdPrefill[i].Load())
	}
	writeTTFTErrorMetrics(b, snap, help)
	var pools strings.Builder
	for _, p := range snap.Pools() {
		if mw, ok := p.Policy.(fleet.MetricsWriter); ok {
			mw.WriteMetrics(p, &pools)
		}
		d.reg.WriteMetricsOff(p, &pools)
	}
	promtext.Group(b, pools.String(), d.reg.MetricFamilies())
	if kb := d.kvHub.Stats(); len(kb) > 0 {
		help("turnout_kv_bind_messages_total", "counter", "KV-event messages received on a bound SUB socket.")
		help("turnout_kv_bind_unknown_topic_total", "counter", "Bound KV-event messages whose topic matched no endpoint (dropped).")
		for addr, st := range kb {
			fmt.Fprintf(b, "turnout_kv_bind_messages_total{bind=%q} %d\n", addr, st.Messages)
			fmt.Fprintf(b, "turnout_kv_bind_unknown_topic_total{bind=%q} %d\n", addr, st.UnknownTopics)
		}
	}
	d.extras.writeMetrics(b)
}

// Refusals: every 4xx/5xx answer turnout gives on its own (a Verdict's
// refusal, or a transport's: unreadable or stalled body, over budget, a
// wrong path), counted by status and reason for
// turnout_refusals_total and logged at most once per refusalLogEvery with
// how many were not logged. An operator then sees why the proxy's clients
// got errors turnout produced, not only that they did.

// refusalLogEvery is the log's rate limit.
const refusalLogEvery = 10 * time.Second

// maxRefusalKinds bounds the (status, reason) pairs counted apart; later
// pairs share one "other" row (reasons are the contract's constants, so
// the table fills only with a handful).
const maxRefusalKinds = 48

type refusalKind struct {
	status int
	reason string
	n      atomic.Uint64
}

// Refusals counts what turnout refused on its own: the request errors by
// kind and the answers >= 400 by status and reason (the transports note
// theirs through Decider.Refusals).
type Refusals struct {
	log *zerolog.Logger

	kinds [maxRefusalKinds]refusalKind
	used  atomic.Int32 // kinds[:used] are filled
	mu    sync.Mutex   // serializes adding a kind
	other atomic.Uint64

	lastLog    atomic.Int64 // unix ns
	suppressed atomic.Uint64
}

// note counts one refusal; allocation-free once its kind was seen.
func (r *Refusals) note(status int, reason string) *refusalKind {
	if k := r.find(status, reason, int(r.used.Load())); k != nil {
		k.n.Add(1)
		return k
	}
	r.mu.Lock()
	n := int(r.used.Load())
	k := r.find(status, reason, n)
	if k == nil && n < maxRefusalKinds {
		k = &r.kinds[n]
		k.status, k.reason = status, reason
		r.used.Store(int32(n + 1))
	}
	r.mu.Unlock()
	if k == nil {
		r.other.Add(1)
		return nil
	}
	k.n.Add(1)
	return k
}

func (r *Refusals) find(status int, reason string, n int) *refusalKind {
	for i := 0; i < n; i++ {
		if k := &r.kinds[i]; k.status == status && k.reason == reason {
			return k
		}
	}
	return nil
}

// NoteRefusal counts an answer >= 400 that a transport wrote on its own
// (a Verdict's refusals are counted by the Decider) and logs it,
// rate-limited. msg says what was refused.
func (r *Refusals) NoteRefusal(status int, reason, msg string) {
	if status < 400 {
		return
	}
	r.note(status, reason)
	now := time.Now().UnixNano()
	last := r.lastLog.Load()
	if now-last < int64(refusalLogEvery) || !r.lastLog.CompareAndSwap(last, now) {
		r.suppressed.Add(1)
		return
	}
	ev := r.log.Warn()
	if status < 500 {
		ev = r.log.Info()
	}
	ev.Int("status", status).Str("reason", reason).Str("detail", msg).
		Uint64("not_logged_since_last", r.suppressed.Swap(0)).
		Msg("request refused by turnout (turnout_refusals_total counts every one; at most one logged per 10s)")
}

// noteVerdict counts a Verdict's refusal.
func (r *Refusals) noteVerdict(v *contract.Verdict) {
	if v.Status >= 400 {
		r.NoteRefusal(v.Status, v.Reason, "decision refused")
	}
}

// writeRefusals renders turnout_refusals_total.
func (r *Refusals) write(b *strings.Builder) {
	fmt.Fprintf(b, "# HELP turnout_refusals_total Answers >= 400 turnout gave on its own (not the replicas'), by status and reason.\n# TYPE turnout_refusals_total counter\n")
	for i := 0; i < int(r.used.Load()); i++ {
		k := &r.kinds[i]
		fmt.Fprintf(b, "turnout_refusals_total{status=\"%d\",reason=%q} %d\n", k.status, k.reason, k.n.Load())
	}
	fmt.Fprintf(b, "turnout_refusals_total{status=\"other\",reason=\"other\"} %d\n", r.other.Load())
	r.writeDeprecated(b)
}

// writeDeprecated renders turnout_request_errors_total, the former
// refusal family, for one release: turnout_refusals_total summed over
// status, under the same reason names.
func (r *Refusals) writeDeprecated(b *strings.Builder) {
	fmt.Fprintf(b, "# HELP turnout_request_errors_total Deprecated, removed in the next release: turnout_refusals_total summed by reason.\n# TYPE turnout_request_errors_total counter\n")
	var reasons [maxRefusalKinds]string
	var sums [maxRefusalKinds]uint64
	n := 0
	for i := 0; i < int(r.used.Load()); i++ {
		k := &r.kinds[i]
		j := 0
		for j < n && reasons[j] != k.reason {
			j++
		}
		if j == n {
			reasons[j] = k.reason
			n++
		}
		sums[j] += k.n.Load()
	}
	for j := range n {
		fmt.Fprintf(b, "turnout_request_errors_total{reason=%q} %d\n", reasons[j], sums[j])
	}
	fmt.Fprintf(b, "turnout_request_errors_total{reason=\"other\"} %d\n", r.other.Load())
}

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

// writeErrorHistogram writes one pool's and source's series of a
// prediction error family.
func writeErrorHistogram(b *strings.Builder, name string, p *fleet.Pool, src estimator.Source, counts []atomic.Uint64, bounds []float64, scale, sum float64) {
	promtext.Histogram(b, name, fmt.Sprintf("deployment=%q,pool=%q,source=%q", p.Deployment, p.Name, src), bounds, scale, counts, sum)
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
