package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/turnout/turnout/route/contract"
)

// Several fronts: N HAProxy (or nginx) + turnout stacks with
// cluster sync over one nats-server, all before the same mock replicas,
// each request through the front FrontOf gives it (--split). One row per front count, each on fresh
// replicas (cold caches, fresh counters).

// maxFronts bounds --fronts: each front is a proxy and a turnout process.
const maxFronts = 16

// maxFrontRows bounds the rows of one --fronts list (sim rounds: 16 of
// "1,2,4").
const maxFrontRows = 64

// ParseFronts reads --fronts: a comma-separated list of front counts
// ("1,2,4"), each in [1, maxFronts], run in that order. A count may come
// again ("1,2,4,1,2,4"): interleaved rounds, so a busy spell of the box
// falls on every count rather than on one.
func ParseFronts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || n > maxFronts {
			return nil, fmt.Errorf("fronts %q: %q is not a count in [1, %d]", s, f, maxFronts)
		}
		if len(out) == maxFrontRows {
			return nil, fmt.Errorf("fronts %q: more than %d rows", s, maxFrontRows)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("fronts %q: want counts such as 1,2,4", s)
	}
	return out, nil
}

// NATSBinary finds nats-server: $PATH, else Debian's /usr/sbin (often not
// in a user's PATH). ErrMissingTool names the package when it is absent.
func NATSBinary(name string) (string, error) {
	if name == "" {
		name = "nats-server"
	}
	p, err := exec.LookPath(name)
	if err == nil {
		return p, nil
	}
	if name == "nats-server" {
		if _, serr := os.Stat("/usr/sbin/nats-server"); serr == nil {
			return "/usr/sbin/nats-server", nil
		}
	}
	return "", fmt.Errorf("%w: %s (several fronts sync over NATS: apt-get install nats-server, or --nats-server PATH): %w", ErrMissingTool, name, err)
}

// startNATS runs nats-server on a free loopback port and waits until it
// accepts connections; it returns the URL turnout's cluster section takes.
func startNATS(ctx context.Context, ps *procSet, dir, bin string) (string, error) {
	port, err := freePort()
	if err != nil {
		return "", err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	p, err := ps.start(dir, "nats-server", bin, "-a", "127.0.0.1", "-p", strconv.Itoa(port))
	if err != nil {
		return "", err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			_ = c.Close()
			return "nats://" + addr, nil
		}
		if p.Exited() || time.Now().After(deadline) || ctx.Err() != nil {
			return "", fmt.Errorf("nats-server on %s: %w (%v)\n%s", addr, errNotReady, err, p.logTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// frontsRow replays reqs through n fronts of spec before fresh replicas.
func frontsRow(ctx context.Context, reqs []Request, trace string, spec PolicySpec, n int, natsURL string, o E2EOptions, inf, pooled float64) (Row, error) {
	start := time.Now()
	dir, err := os.MkdirTemp(o.WorkDir, fmt.Sprintf("e2e-%s-%dfronts-", spec.Policy, n))
	if err != nil {
		return Row{}, fmt.Errorf("run dir: %w", err)
	}
	if !o.Keep {
		defer os.RemoveAll(dir)
	}
	var stacks []*Stack
	defer func() {
		// The first stack owns the replicas: stop it last.
		for i := len(stacks) - 1; i >= 0; i-- {
			stacks[i].Stop()
		}
	}()
	var mocks []Endpoint
	urls := make([]string, 0, n)
	for k := range n {
		fdir := filepath.Join(dir, "front-"+strconv.Itoa(k))
		if err := os.MkdirAll(fdir, 0o755); err != nil {
			return Row{}, fmt.Errorf("front dir: %w", err)
		}
		so := StackOptions{
			Dir: fdir, Spec: spec, ProxySetup: o.ProxySetup, Replicas: o.Sim.Replicas, Model: o.Sim.Model,
			MockArgs: ReplayMockArgs(o.Sim, o.TimeScale), Mocks: mocks, Log: o.Log,
		}
		if !spec.IsProxyAlone() {
			so.ClusterNATS, so.ClusterName = natsURL, fmt.Sprintf("f%d-%d", n, k)
		}
		st, err := StartStack(ctx, so)
		if err != nil {
			return Row{}, fmt.Errorf("front %d of %d: %w", k, n, err)
		}
		stacks = append(stacks, st)
		mocks = st.Mocks
		urls = append(urls, st.FrontURL)
	}
	for _, st := range stacks {
		if st.TurnoutURL == "" {
			continue
		}
		if err := waitClusterConnected(ctx, st.TurnoutURL, 10*time.Second); err != nil {
			return Row{}, err
		}
	}

	rctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	res, err := Drive(rctx, reqs, DriveOptions{
		URLs: urls, Front: FrontOf(reqs, n, o.Sim.Split, o.Sim.Seed), Model: o.Sim.Model, Concurrency: o.Sim.Concurrency,
		Compress: o.Sim.Compress, TimeScale: o.TimeScale, Log: o.Log,
	})
	if err != nil {
		return Row{}, err
	}
	if res.Replicas, err = stacks[0].ReplicaLoads(ctx); err != nil {
		return Row{}, err
	}
	row := MakeRow(e2eMode(spec, o), trace, spec, res, inf, pooled, 1/o.TimeScale)
	row.Fronts = n
	var texts []string
	for _, st := range stacks {
		if st.TurnoutURL == "" {
			continue
		}
		text, err := getText(ctx, st.TurnoutURL+contract.PathMetrics)
		if err != nil {
			return Row{}, fmt.Errorf("turnout metrics: %w", err)
		}
		texts = append(texts, text)
	}
	row.SyncBytes, row.SyncMsgs = SyncPerDecision(texts)
	// The fronts' counters are all counters: summing the pages sums them.
	all := strings.Join(texts, "\n")
	row.Detail = DecisionDetail(all)
	// Requests the replicas served without a decision went the proxy's
	// fallback way (turnout did not answer in time): on a box too busy
	// for the fronts, they, not the policy, set the row's hit ratio.
	var served int64
	for _, r := range res.Replicas {
		served += r.Requests
	}
	if u := served - int64(SumProm(ParseProm(all), "turnout_decisions_total")); u > 0 {
		row.Detail += " undecided=" + strconv.FormatInt(u, 10)
	}
	row.Wall = time.Since(start)
	return row, nil
}

// waitClusterConnected polls turnout's /metrics until its NATS connection
// is up, so the first requests already sync.
func waitClusterConnected(ctx context.Context, turnoutURL string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		text, err := getText(ctx, turnoutURL+contract.PathMetrics)
		if err == nil && SumProm(ParseProm(text), "turnout_cluster_connected") == 1 {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("turnout %s: cluster not connected after %v: %w", turnoutURL, timeout, errNotReady)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// SyncPerDecision sums the fronts' cluster counters (pages of turnout's
// /metrics) and returns NATS payload bytes and messages out per published
// decision (0, 0 when none was published).
func SyncPerDecision(pages []string) (bytesPer, msgsPer float64) {
	var bytes, msgs, decs float64
	for _, p := range pages {
		for _, s := range ParseProm(p) {
			switch {
			case s.Name == "turnout_cluster_bytes_total" && s.Labels["direction"] == "out":
				bytes += s.Value
			case s.Name == "turnout_cluster_messages_total" && s.Labels["direction"] == "out":
				msgs += s.Value
			case s.Name == "turnout_cluster_decisions_total" && s.Labels["result"] == "published":
				decs += s.Value
			}
		}
	}
	if decs == 0 {
		return 0, 0
	}
	return bytes / decs, msgs / decs
}

// FrontsLine compares one multi-front row with the one-front row of the
// same policy and trace in the same run (Base nil: there is none).
type FrontsLine struct {
	Row  *Row
	Base *Row
}

// Hit, P90 and P99 are the row's hit ratio and TTFT percentiles over the
// one-front row's (0: no base).
func (l FrontsLine) Hit() float64 {
	return l.ratio(l.Row.HitRatio, l.baseOf(func(r *Row) float64 { return r.HitRatio }))
}

// P90 is the TTFT p90 over the one-front row's.
func (l FrontsLine) P90() float64 {
	return l.ratio(l.Row.TTFT.P90, l.baseOf(func(r *Row) float64 { return r.TTFT.P90 }))
}

// P99 is the TTFT p99 over the one-front row's.
func (l FrontsLine) P99() float64 {
	return l.ratio(l.Row.TTFT.P99, l.baseOf(func(r *Row) float64 { return r.TTFT.P99 }))
}

// Engine is the replicas' own mean TTFT over the one-front row's.
func (l FrontsLine) Engine() float64 {
	return l.ratio(l.Row.EngineTTFT, l.baseOf(func(r *Row) float64 { return r.EngineTTFT }))
}

func (l FrontsLine) baseOf(f func(*Row) float64) float64 {
	if l.Base == nil {
		return 0
	}
	return f(l.Base)
}

func (FrontsLine) ratio(v, base float64) float64 {
	if base <= 0 {
		return 0
	}
	return v / base
}

// FrontsLines pairs every multi-front row with a one-front row of the
// same trace and policy: the nearest one before it (its round), else the
// first after (skipped rows and plain rows are left out).
func FrontsLines(rows []Row) []FrontsLine {
	var out []FrontsLine
	same := func(a, b *Row) bool {
		return b.Fronts == 1 && b.Note == "" && b.Trace == a.Trace && b.Policy == a.Policy && b.Mode == a.Mode
	}
	for i := range rows {
		r := &rows[i]
		if r.Fronts == 0 || r.Note != "" {
			continue
		}
		l := FrontsLine{Row: r}
		for j := i; j >= 0 && l.Base == nil; j-- {
			if same(r, &rows[j]) {
				l.Base = &rows[j]
			}
		}
		for j := i + 1; j < len(rows) && l.Base == nil; j++ {
			if same(r, &rows[j]) {
				l.Base = &rows[j]
			}
		}
		out = append(out, l)
	}
	return out
}

// WriteFrontsTable writes the multi-front rows against one front: the
// goals (hit >= 0.98 of one front's, TTFT p90 and p99 within
// 1.05x, requests max/mean <= 1.05) and the sync traffic.
func WriteFrontsTable(w io.Writer, rows []Row) error {
	lines := FrontsLines(rows)
	if len(lines) == 0 {
		return nil
	}
	err := writeTable(w, "policy\tfronts\thit\tvs 1\tload req\tTTFT p50 ms\tp90\tp99\tp90 vs 1\tp99 vs 1\tengine TTFT mean\tsync B/dec\tmsgs/dec\tsync µs/dec/front\t", len(lines), func(tw io.Writer, i int) {
		l := &lines[i]
		r := l.Row
		fmt.Fprintf(tw, "%s\t%d\t%.3f\t%s\t%.3f\t%.0f\t%.0f\t%.0f\t%s\t%s\t%.0f\t%.0f\t%.2f\t%.2f\t\n", r.Policy, r.Fronts, r.HitRatio, ratioCell(l.Hit()),
			r.LoadReq, r.TTFT.P50, r.TTFT.P90, r.TTFT.P99, ratioCell(l.P90()), ratioCell(l.P99()), r.EngineTTFT, r.SyncBytes, r.SyncMsgs, r.SyncUs)
	})
	if err != nil {
		return fmt.Errorf("fronts: %w", err)
	}
	means := FrontsMeans(lines)
	if len(means) == 0 {
		return nil
	}
	fmt.Fprintln(w, "\nmeans over rounds (each N-front row against its round's one front):")
	err = writeTable(w, "policy\tfronts\trounds\thit vs 1\tload req\tworst load req\tp90 vs 1\tp99 vs 1\tengine TTFT vs 1\t", len(means), func(tw io.Writer, i int) {
		m := &means[i]
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%.3f\t%.3f\t%s\t%s\t%s\t\n", m.Policy, m.Fronts, m.Rounds, ratioCell(m.Hit),
			m.LoadReq, m.WorstLoadReq, ratioCell(m.P90), ratioCell(m.P99), ratioCell(m.Engine))
	})
	if err != nil {
		return fmt.Errorf("fronts means: %w", err)
	}
	return nil
}

// FrontsMean averages the lines of one policy and front count over rounds
// (--fronts 1,2,4,1,2,4): a single replay's TTFT p99 moves by 10 % with
// the placement's chance alone (the sim's seeds), so the acceptance is
// read on the mean.
type FrontsMean struct {
	Policy                               string
	Fronts, Rounds                       int
	Hit, LoadReq, WorstLoadReq, P90, P99 float64
	Engine                               float64
}

// FrontsMeans returns one mean per policy and front count that has at
// least two lines with a base, the one-front rows included (their ratios
// are 1: LoadReq is then one front's own mean), in first-seen order.
func FrontsMeans(lines []FrontsLine) []FrontsMean {
	type key struct {
		policy string
		fronts int
	}
	var order []key
	acc := map[key]*FrontsMean{}
	for _, l := range lines {
		if l.Base == nil {
			continue
		}
		k := key{l.Row.Policy, l.Row.Fronts}
		m := acc[k]
		if m == nil {
			m = &FrontsMean{Policy: k.policy, Fronts: k.fronts}
			acc[k] = m
			order = append(order, k)
		}
		m.Rounds++
		m.Hit += l.Hit()
		m.LoadReq += l.Row.LoadReq
		m.WorstLoadReq = max(m.WorstLoadReq, l.Row.LoadReq)
		m.P90 += l.P90()
		m.P99 += l.P99()
		m.Engine += l.Engine()
	}
	var out []FrontsMean
	for _, k := range order {
		m := acc[k]
		if m.Rounds < 2 {
			continue
		}
		n := float64(m.Rounds)
		m.Hit, m.LoadReq, m.P90, m.P99, m.Engine = m.Hit/n, m.LoadReq/n, m.P90/n, m.P99/n, m.Engine/n
		out = append(out, *m)
	}
	return out
}

func ratioCell(v float64) string {
	if v == 0 {
		return "-"
	}
	return strconv.FormatFloat(v, 'f', 3, 64)
}
