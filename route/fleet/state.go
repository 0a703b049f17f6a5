package fleet

import (
	"sync/atomic"
	"time"

	"github.com/turnout/turnout/internal/promtext"
)

// RequestBuckets are request duration bounds in seconds: LLM requests run
// from tens of milliseconds (cached, short) to minutes (long streams).
var RequestBuckets = [...]float64{0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}

// StatusClasses are the class label values, indexed by classOf.
var StatusClasses = [...]string{"2xx", "3xx", "4xx", "5xx", "other"}

func classOf(status int64) int {
	if status >= 200 && status < 600 {
		return int(status/100) - 2
	}
	return len(StatusClasses) - 1 // 1xx, or -1 when the proxy had no response
}

type MsHistogram struct {
	Counts [len(RequestBuckets) + 1]atomic.Uint64
	SumMs  atomic.Uint64
}

func (h *MsHistogram) observe(ms int64) {
	h.Counts[promtext.Bucket(RequestBuckets[:], float64(ms)/1e3)].Add(1)
	h.SumMs.Add(uint64(ms))
}

type Feedback struct {
	Classes  [len(StatusClasses)]atomic.Uint64
	Duration MsHistogram
	TTFB     MsHistogram
	// FirstToken is the time to the first response body bytes (tft=).
	FirstToken MsHistogram
}

// Observe records one feedback line for the endpoint (values < 0 are
// unknown). verified: the line closed one of turnout's open decisions (it
// carried an id only the proxy learned); only such a line may clear stall
// suspicion, so lines anyone on a feedback source can send (id=-) cannot
// keep a stalled endpoint in rotation. Any line may raise suspicion.
func (st *State) Observe(status, ms, ttfb, now int64, verified bool) {
	if status >= 0 {
		st.Feedback.Classes[classOf(status)].Add(1)
	}
	if ms >= 0 {
		st.Feedback.Duration.observe(ms)
	}
	if ttfb >= 0 {
		st.Feedback.TTFB.observe(ttfb)
	}
	st.Stall.onFeedback(ms, ttfb, now, verified)
}

// ObserveFirstToken records one completion's time to the replica's first
// response body bytes (the feedback line's tft=, or /internal/done's).
func (st *State) ObserveFirstToken(ms int64) {
	if ms >= 0 {
		st.Feedback.FirstToken.observe(ms)
	}
}

// LatencyBuckets are decision latency bounds in seconds.
var LatencyBuckets = [...]float64{5e-6, 10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 10e-3, 50e-3, 250e-3, 1}

type histogram struct {
	Counts [len(LatencyBuckets) + 1]atomic.Uint64
	SumNs  atomic.Uint64
}

func (h *histogram) Observe(d time.Duration) {
	h.Counts[promtext.Bucket(LatencyBuckets[:], d.Seconds())].Add(1)
	h.SumNs.Add(uint64(d))
}

type PoolMetrics struct {
	Outcomes      [NumOutcomes]atomic.Uint64
	MatchedBlocks atomic.Uint64
	TotalBlocks   atomic.Uint64
	// ShortPrompts counts prompts shorter than one block: nothing hashed,
	// nothing a prefix policy could match (route/hints says so).
	ShortPrompts atomic.Uint64
	Latency      histogram
}

// StallState is an endpoint's stall detection state (atomics: not copied).
type StallState struct {
	BudgetNs atomic.Int64 // 0 = off; set by each snapshot
	// ScaledNs is the limit scaled to the replica's first-token times
	// (health.stall.scale x p99, at least health.stall.floor; 0 = not
	// known); Limit caps it by the budget.
	ScaledNs atomic.Int64
	Degraded atomic.Bool
	Suspect  atomic.Bool
	Probing  atomic.Bool
	// LastProbe is when the last probe started (unix ns).
	LastProbe atomic.Int64
	// FastStart is the start (unix ns) of the latest request known to have
	// been answered within the budget (feedback or probe).
	FastStart atomic.Int64
	// Since is when the endpoint was degraded (unix ns).
	Since atomic.Int64
	// Unanswered counts verified completions in a row that ended before
	// the replica's response headers.
	Unanswered atomic.Int32
	window     stallWindow
}

// UnansweredSuspect is how many completions in a row without response
// headers make an endpoint suspect (a probe then tells).
const UnansweredSuspect = 3

// onFeedback takes one completion's times (ms, -1 = unknown); only a
// verified one counts as an answer in time.
func (ss *StallState) onFeedback(ms, ttfb, now int64, verified bool) {
	b := ss.Limit()
	if b <= 0 {
		return
	}
	limitMs := b / int64(time.Millisecond)
	if ttfb >= limitMs {
		ss.Suspect.Store(true)
		return
	}
	if !verified {
		return
	}
	if ttfb < 0 {
		// No response headers: the client or the proxy gave up before the
		// replica answered (nginx's 499, HAProxy's %Tr -1), however soon.
		// Not an answer in time; a few in a row make the endpoint suspect,
		// since a client timeout under half the limit never leaves a
		// decision open long enough for the ledger's sweep to see it.
		if ss.Unanswered.Add(1) >= UnansweredSuspect {
			ss.Suspect.Store(true)
		}
		return
	}
	ss.Unanswered.Store(0)
	start := now - max(ms, ttfb)*int64(time.Millisecond)
	if start > ss.FastStart.Load() {
		ss.FastStart.Store(start)
	}
}
