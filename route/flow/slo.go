package flow

import (
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/turnout/turnout/internal/config"
)

// A request's time-to-first-token objective: its class's ttft_slo, or the
// trusted SLO header's value in milliseconds. Routing reads it (the
// policy picks a replica predicted to meet it, fleet.Request's
// TTFTObjectiveMs); admission sheds a request of a shedding class that
// is predicted to miss it on every replica (ShedForSLO) rather than
// queueing it in an engine; every request with an objective ends met,
// missed or shed (turnout_slo_requests_total).

// SLOOutcome is how a request with an objective ended.
type SLOOutcome uint8

// SLO outcomes.
const (
	// SLOMet: its first token came within the objective.
	SLOMet SLOOutcome = iota
	// SLOMissed: it came later, or the request never reported one.
	SLOMissed
	// SLOShed: refused with 429, predicted to miss on every replica.
	SLOShed
	numSLOOutcomes
)

var sloOutcomeNames = [numSLOOutcomes]string{"met", "missed", "shed"}

func (o SLOOutcome) String() string { return sloOutcomeNames[o] }

// sloCounts are one class's outcomes.
type sloCounts [numSLOOutcomes]atomic.Uint64

// maxSLOHeaderMs bounds an objective a header may name.
var maxSLOHeaderMs = config.MaxTTFTSLO.Milliseconds()

// objective is the TTFT objective in ms of a request of class whose
// trusted SLO header says v (nil: absent): the header's when it is a
// whole number of ms in (0, config.MaxTTFTSLO], else the class's (0: none).
func (c *Controller) objective(class int, v []byte) int32 {
	if ms, ok := parseMs(v); ok {
		return ms
	}
	return int32(c.cfg.Classes[class].TTFTSLO.D().Milliseconds())
}

// parseMs reads a positive whole number of milliseconds, without
// allocating; false for anything else (the class default then applies).
func parseMs(v []byte) (int32, bool) {
	if len(v) == 0 || len(v) > 9 {
		return 0, false
	}
	var n int64
	for _, ch := range v {
		if ch < '0' || ch > '9' {
			return 0, false
		}
		n = n*10 + int64(ch-'0')
	}
	if n <= 0 || n > maxSLOHeaderMs {
		return 0, false
	}
	return int32(n), true
}

// ShedForSLO reports whether r, whose remaining objective is leftMs
// (its objective less the time it was held) and whose routed replica is
// predicted to give its first token in predictedMs (the policy's best:
// the lowest prediction when none meets the objective), is shed: only a
// request of a shedding class with an objective and a prediction. A
// critical request (the highest class never sheds) is routed whatever
// the prediction. Counts the shed.
func (c *Controller) ShedForSLO(r *Request, leftMs, predictedMs float32) bool {
	if r.SLOMs <= 0 || predictedMs <= 0 || !c.cfg.Classes[r.Class].Shed || predictedMs <= leftMs {
		return false
	}
	c.slo[r.Class][SLOShed].Add(1)
	return true
}

// ObserveSLO counts a routed request of class with an objective of
// objectiveMs whose first token came after firstTokenMs (or, without a
// first-token time, whose response ended then).
func (c *Controller) ObserveSLO(class int, objectiveMs, firstTokenMs int64) {
	if class < 0 || class >= len(c.slo) || objectiveMs <= 0 {
		return
	}
	o := SLOMet
	if firstTokenMs < 0 || firstTokenMs > objectiveMs {
		o = SLOMissed
	}
	c.slo[class][o].Add(1)
}

// SLOCount is how many requests of class (by name) ended with o (tests,
// benchmarks).
func (c *Controller) SLOCount(class string, o SLOOutcome) uint64 {
	i := c.cfg.ClassIndex(class)
	if i < 0 {
		return 0
	}
	return c.slo[i][o].Load()
}

// sloFamily is the SLO metric family.
var sloFamily = [3]string{"turnout_slo_requests_total", "counter", "Requests with a time-to-first-token objective by class and outcome: met (first token within it), missed (later, or no first token reported), shed (429: predicted to miss on every replica, shedding classes only)."}

// writeSLOMetrics renders the controller's SLO counters for deployment dep.
func (c *Controller) writeSLOMetrics(b *strings.Builder, dep string) {
	for ci := range c.slo {
		cl := c.cfg.Classes[ci].Name
		for o := SLOOutcome(0); o < numSLOOutcomes; o++ {
			fmt.Fprintf(b, "turnout_slo_requests_total{deployment=%q,class=%q,outcome=%q} %d\n", dep, cl, o, c.slo[ci][o].Load())
		}
	}
}

// writeSLOReadiness writes the attainment of each class that saw a
// request with an objective: "slo llama: critical 98.2% met (491/500,
// 0 shed), sheddable 71.0% met (142/200, 31 shed)"; nothing when none did.
func (c *Controller) writeSLOReadiness(b *strings.Builder, dep string) {
	first := true
	for ci := range c.slo {
		met, missed, shed := c.slo[ci][SLOMet].Load(), c.slo[ci][SLOMissed].Load(), c.slo[ci][SLOShed].Load()
		if met+missed+shed == 0 {
			continue
		}
		if first {
			fmt.Fprintf(b, "slo %s: ", dep)
			first = false
		} else {
			b.WriteString(", ")
		}
		pct := 0.0
		if met+missed > 0 {
			pct = 100 * float64(met) / float64(met+missed)
		}
		fmt.Fprintf(b, "%s %.1f%% met (%d/%d, %d shed)", c.cfg.Classes[ci].Name, pct, met, met+missed, shed)
	}
	if !first {
		b.WriteByte('\n')
	}
}

// ObjectiveLeft is what is left of r's objective in ms after it was held
// for held (0: no objective; at least 1 ms: a request held past its
// objective still goes to the replica predicted fastest).
func (r *Request) ObjectiveLeft(held time.Duration) float32 {
	if r.SLOMs <= 0 {
		return 0
	}
	return max(float32(r.SLOMs)-float32(held.Microseconds())/1000, 1)
}

// SLOTicket is what a decision keeps of its request's objective until its
// completion counts it (the zero value: none, counts nothing).
type SLOTicket struct {
	c     *Controller
	class int32
	ms    int32
}

// Ticket is r's ticket (zero on a nil controller or without an objective).
func (c *Controller) Ticket(r *Request) SLOTicket {
	if c == nil || r.SLOMs <= 0 {
		return SLOTicket{}
	}
	return SLOTicket{c: c, class: int32(r.Class), ms: r.SLOMs}
}

// On reports whether the ticket counts anything (its request has an objective).
func (t SLOTicket) On() bool { return t.c != nil }

// Observe counts the ticket's request met or missed: its first token (or,
// without a first-token time, its end) came after atMs.
func (t SLOTicket) Observe(atMs int64) {
	if t.c != nil {
		t.c.ObserveSLO(int(t.class), int64(t.ms), atMs)
	}
}
