package bench

import (
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Row is one line of a replay table: one router on one trace in one mode.
type Row struct {
	Mode   string // sim or e2e
	Trace  string
	Policy string // PolicySpec.String()
	// Requests completed and requests that failed.
	Requests, Errors int
	// HitRatio is cached prompt tokens / prompt tokens over all replicas.
	HitRatio float64
	// InfBound is the infinite-cache hit ratio of the same requests; Pooled
	// is one LRU cache the size of all replicas together.
	InfBound, Pooled float64
	// LoadReq and LoadTok are per-replica max/mean of requests and of prompt
	// tokens.
	LoadReq, LoadTok float64
	// TTFT in milliseconds of model time (e2e: real time / time scale).
	TTFT Summary
	// E2EP50 and E2EP99 are request latencies in model milliseconds.
	E2EP50, E2EP99 float64
	// RPS and TokPS are completed requests and output tokens per model second.
	RPS, TokPS float64
	// RouteUs is the mean wall time of one routing decision (sim), in µs.
	RouteUs float64
	// Wall is how long the run took.
	Wall time.Duration
	// Detail is extra information (decision outcomes).
	Detail string
	// Note carries a skip or failure reason.
	Note string
	// AdapterLoads counts adapter switches, in replays with LoRA adapters
	// (Adapters set).
	Adapters     bool
	AdapterLoads int64
	// Fronts is the number of HAProxy + turnout fronts of a multi-front
	// e2e row (fronts.go; 0 = the single stack of a plain row), and
	// SyncBytes and SyncMsgs their NATS bytes and messages out per
	// published decision, summed over the fronts.
	Fronts              int
	SyncBytes, SyncMsgs float64
	// SyncUs is, in the sim, the time one front spends on the sync
	// (encoding, decoding and applying route/cluster's messages) per
	// decision of all fronts, in µs: the fronts' total over decisions x
	// fronts (0: not measured).
	SyncUs float64
	// EngineTTFT is the replicas' own mean TTFT in model milliseconds
	// (e2e: the mocks' histograms; sim: from the decision to the first
	// token; 0: not reported): queue wait and prefill, so a gap between
	// rows here is routing, and one only in TTFT is the path before the
	// replica (proxy, turnout, a busy box).
	EngineTTFT float64
}

// Label names the row in tables: the policy, and the front count of a
// multi-front row.
func (r *Row) Label() string {
	// The seat, beside the same policy's rows of a run with several
	// (--proxy haproxy,nginx,epp).
	switch {
	case r.Mode == ModeE2EEPP:
		return r.Policy + " (epp)"
	case strings.HasPrefix(r.Mode, "e2e-nginx") && !r.isProxyAlone():
		return r.Policy + " (nginx)"
	}
	if r.Fronts > 0 {
		return r.Policy + " fronts=" + strconv.Itoa(r.Fronts)
	}
	return r.Policy
}

// isProxyAlone reports whether the row is a proxy balancing alone.
func (r *Row) isProxyAlone() bool {
	name, _, _ := strings.Cut(r.Policy, ":")
	return PolicySpec{Policy: name}.IsProxyAlone()
}

// MakeRow condenses a run. scale converts measured durations to model time
// (1 in sim, 1/time-scale in e2e).
func MakeRow(mode, trace string, spec PolicySpec, res *RunResult, inf, pooled, scale float64) Row {
	row := Row{Mode: mode, Trace: trace, Policy: spec.String(), Requests: res.Requests, Errors: res.Errors, InfBound: inf, Pooled: pooled}
	var prompt, cached, out, ttftSum, ttftN float64
	req := make([]float64, len(res.Replicas))
	tok := make([]float64, len(res.Replicas))
	for i, l := range res.Replicas {
		ttftSum += l.TTFTSeconds
		ttftN += float64(l.TTFTCount)
		prompt += float64(l.PromptTokens)
		cached += float64(l.CachedTokens)
		out += float64(l.OutputTokens)
		req[i] = float64(l.Requests)
		tok[i] = float64(l.PromptTokens)
	}
	row.HitRatio = Ratio(cached, prompt)
	if ttftN > 0 {
		row.EngineTTFT = ttftSum / ttftN * 1000 * scale
	}
	row.LoadReq = MaxOverMean(req)
	row.LoadTok = MaxOverMean(tok)
	ms := Millis(res.TTFT)
	for i := range ms {
		ms[i] *= scale
	}
	row.TTFT = Summarize(ms)
	e2e := Millis(res.E2E)
	for i := range e2e {
		e2e[i] *= scale
	}
	es := Summarize(e2e)
	row.E2EP50, row.E2EP99 = es.P50, es.P99
	if span := res.Span.Seconds() * scale; span > 0 {
		row.RPS = float64(res.Requests) / span
		row.TokPS = out / span
	}
	if res.Requests > 0 && res.RouteTime > 0 {
		row.RouteUs = float64(res.RouteTime.Microseconds()) / float64(res.Requests+res.Errors)
	}
	return row
}

// Check returns an error when a row cannot be right: the smoke run fails on it.
func (r *Row) Check() error {
	switch {
	case r.Note != "":
		return nil // skipped rows carry their reason
	case r.Requests == 0:
		return fmt.Errorf("%s %s %s: no request completed", r.Mode, r.Trace, r.Label())
	case r.Errors*100 > r.Requests:
		return fmt.Errorf("%s %s %s: %d of %d requests failed", r.Mode, r.Trace, r.Label(), r.Errors, r.Requests+r.Errors)
	case math.IsNaN(r.HitRatio) || r.HitRatio < 0 || r.HitRatio > 1:
		return fmt.Errorf("%s %s %s: hit ratio %v outside [0,1]", r.Mode, r.Trace, r.Label(), r.HitRatio)
	case r.InfBound < 0 || r.InfBound > 1 || r.HitRatio > r.InfBound+1e-9:
		return fmt.Errorf("%s %s %s: hit ratio %.4f above the infinite-cache bound %.4f", r.Mode, r.Trace, r.Label(), r.HitRatio, r.InfBound)
	case r.LoadReq < 1-1e-9:
		return fmt.Errorf("%s %s %s: load max/mean %.3f below 1", r.Mode, r.Trace, r.Label(), r.LoadReq)
	}
	return nil
}

var rowHeader = []string{
	"mode", "trace", "policy", "requests", "errors", "hit_ratio", "inf_bound", "pooled_bound", "hit_vs_inf",
	"load_req_max_mean", "load_tok_max_mean", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "e2e_p50_ms", "e2e_p99_ms",
	"rps", "out_tok_per_s", "route_us", "wall_s", "detail", "note",
}

func f4(v float64) string { return strconv.FormatFloat(v, 'f', 4, 64) }
func f1(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }

func (r *Row) fields() []string {
	return []string{
		r.Mode, r.Trace, r.Label(), strconv.Itoa(r.Requests), strconv.Itoa(r.Errors),
		f4(r.HitRatio), f4(r.InfBound), f4(r.Pooled), f4(Ratio(r.HitRatio, r.InfBound)),
		f4(r.LoadReq), f4(r.LoadTok), f1(r.TTFT.P50), f1(r.TTFT.P90), f1(r.TTFT.P99), f1(r.E2EP50), f1(r.E2EP99),
		f4(r.RPS), f1(r.TokPS), f1(r.RouteUs), f1(r.Wall.Seconds()), r.Detail, r.Note,
	}
}

// WriteCSV writes rows with a header line.
func WriteCSV(w io.Writer, rows []Row) error {
	return writeCSV(w, rowHeader, len(rows), func(i int) []string { return rows[i].fields() })
}

// writeCSV writes header, then n records: fields(i) is the i-th.
func writeCSV(w io.Writer, header []string, n int, fields func(i int) []string) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(header); err != nil {
		return fmt.Errorf("csv header: %w", err)
	}
	for i := range n {
		if err := cw.Write(fields(i)); err != nil {
			return fmt.Errorf("csv row: %w", err)
		}
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("csv: %w", err)
	}
	return nil
}

// figures are the columns both tables print for a row, in order: the
// policy, requests, hit ratios, load spread, TTFT percentiles and rps.
func (r *Row) figures() []any {
	return []any{r.Label(), r.Requests, r.HitRatio, r.InfBound, r.Pooled, Ratio(r.HitRatio, r.InfBound),
		r.LoadReq, r.LoadTok, r.TTFT.P50, r.TTFT.P90, r.TTFT.P99, r.RPS}
}

// WriteTable writes rows as an aligned text table for terminals and
// BENCHMARKS.md (fewer columns than the CSV).
func WriteTable(w io.Writer, rows []Row) error {
	err := writeTable(w, "policy\treqs\thit\tinf bound\tpooled\thit/inf\tload req\tload tok\tTTFT p50 ms\tp90\tp99\trps\troute µs\t", len(rows), func(tw io.Writer, i int) {
		r := &rows[i]
		if r.Note != "" {
			fmt.Fprintf(tw, "%s\t%s\t\t\t\t\t\t\t\t\t\t\t\t\n", r.Label(), r.Note)
			return
		}
		fmt.Fprintf(tw, "%s\t%d\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%.0f\t%.0f\t%.0f\t%.2f\t%.1f\t\n", append(r.figures(), r.RouteUs)...)
	})
	if err != nil {
		return err
	}
	return writeAdapterLoads(w, rows)
}

// writeTable writes an aligned text table for terminals, its columns
// aligned right: head is the header line, row writes row i.
func writeTable(w io.Writer, head string, n int, row func(tw io.Writer, i int)) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, head)
	for i := range n {
		row(tw, i)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("table: %w", err)
	}
	return nil
}

// writeAdapterLoads lists the adapter switches of LoRA replays (lora.go).
func writeAdapterLoads(w io.Writer, rows []Row) error {
	for i := range rows {
		if r := &rows[i]; r.Adapters && r.Note == "" {
			if _, err := fmt.Fprintf(w, "adapter switches %s: %d of %d requests (TTFT p50 %.0f p90 %.0f p99 %.0f ms)\n",
				r.Policy, r.AdapterLoads, r.Requests, r.TTFT.P50, r.TTFT.P90, r.TTFT.P99); err != nil {
				return fmt.Errorf("table: %w", err)
			}
		}
	}
	return nil
}

// WriteMarkdown writes rows as a Markdown table (pasted into BENCHMARKS.md).
func WriteMarkdown(w io.Writer, rows []Row) error {
	return writeMarkdown(w, "| policy | requests | hit ratio | inf. bound | pooled | hit/inf | load max/mean (req) | (tok) | TTFT p50 ms | p90 | p99 | rps |\n"+
		"|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n", len(rows), func(b *strings.Builder, i int) {
		r := &rows[i]
		if r.Note != "" {
			fmt.Fprintf(b, "| %s | %s |||||||||||\n", r.Label(), r.Note)
			return
		}
		fmt.Fprintf(b, "| %s | %d | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.0f | %.0f | %.0f | %.2f |\n", r.figures()...)
	})
}

// writeMarkdown writes a Markdown table: head (the header line and its
// rule), then row(b, i) for each of n rows, each writing one line.
func writeMarkdown(w io.Writer, head string, n int, row func(b *strings.Builder, i int)) error {
	var b strings.Builder
	b.WriteString(head)
	for i := range n {
		row(&b, i)
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("markdown: %w", err)
	}
	return nil
}
