package bench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/lab/mock"
	"github.com/turnout/turnout/route/contract"
)

// The background axis of the scale envelope (docs/scale.md): what a
// fleet costs when nobody asks anything of it, and under a steady stream
// of decisions. N mock replicas in this process (one listener each), F
// turnout processes in front of them (over one nats-server when F > 1),
// and per phase the requests the replicas got from turnout by kind
// (engine scrapes, which also carry the LoRA info; health checks;
// /v1/models polls) per replica per second, and turnout's CPU.

// BackgroundOptions chooses the cells of RunBackground.
type BackgroundOptions struct {
	Turnout    string // turnout binary
	NATSServer string // nats-server binary (fronts > 1)
	Replicas   []int
	Fronts     []int
	// Share lists the engine_metrics.share settings to run each
	// multi-front cell with.
	Share []bool
	// Warmup passes before the rest phase (the idle backoff settles);
	// Rest and Load are the phases' lengths.
	Warmup, Rest, Load time.Duration
	// LoadRPS is the decisions a second in total under load, each closed
	// at once over /internal/done (0: one per replica a second).
	LoadRPS int
	Dir     string
	Log     *zerolog.Logger
}

// DefaultBackgroundOptions are the grid of docs/scale.md.
func DefaultBackgroundOptions() BackgroundOptions {
	return BackgroundOptions{
		Turnout:  "turnout",
		Replicas: []int{16, 64, 256, 1024},
		Fronts:   []int{1, 8},
		Share:    []bool{false, true},
		Warmup:   6 * time.Second,
		Rest:     15 * time.Second,
		Load:     10 * time.Second,
	}
}

// BackgroundRow is one phase of one cell.
type BackgroundRow struct {
	Replicas, Fronts int
	Share            bool
	Phase            string // rest or load
	Seconds          float64
	Decisions        int64
	// Per replica per second, all fronts together.
	Scrapes, Health, Models float64
	// CPUms is turnout's CPU (all fronts) in ms per replica per second;
	// Cores the same in cores.
	CPUms, Cores float64
	Err          string
}

// RunBackground measures each cell: replicas x fronts (x share when
// fronts > 1), at rest then under load.
func RunBackground(ctx context.Context, o BackgroundOptions) ([]BackgroundRow, error) {
	if o.Log == nil {
		l := zerolog.Nop()
		o.Log = &l
	}
	var rows []BackgroundRow
	for _, n := range o.Replicas {
		for _, f := range o.Fronts {
			shares := o.Share
			if f == 1 {
				shares = []bool{false}
			}
			for _, sh := range shares {
				if ctx.Err() != nil {
					return rows, ctx.Err()
				}
				got, err := backgroundCell(ctx, o, n, f, sh)
				if err != nil {
					msg, _, _ := strings.Cut(err.Error(), "\n")
					got = []BackgroundRow{{Replicas: n, Fronts: f, Share: sh, Phase: "-", Err: msg}}
				}
				for _, r := range got {
					o.Log.Info().Int("replicas", n).Int("fronts", f).Bool("share", sh).Str("phase", r.Phase).
						Float64("scrapes", r.Scrapes).Float64("cpu_ms", r.CPUms).Str("error", r.Err).Msg("bench: background")
				}
				rows = append(rows, got...)
			}
		}
	}
	return rows, nil
}

// backgroundCell runs one cell in its own directory.
func backgroundCell(ctx context.Context, o BackgroundOptions, n, fronts int, share bool) ([]BackgroundRow, error) {
	dir := filepath.Join(o.Dir, fmt.Sprintf("background-%d-%d-%t", n, fronts, share))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("background: %w", err)
	}
	reps, eps, err := startReplicas(n)
	defer closeReplicas(reps)
	if err != nil {
		return nil, fmt.Errorf("background: %w", err)
	}
	ps := &procSet{}
	defer ps.stopAll()
	natsURL := ""
	if fronts > 1 {
		bin, err := NATSBinary(o.NATSServer)
		if err != nil {
			return nil, err
		}
		if natsURL, err = startNATS(ctx, ps, dir, bin); err != nil {
			return nil, err
		}
	}
	fo := frontOptions{Turnout: o.Turnout, NATS: natsURL, Extra: fmt.Sprintf("engine_metrics: {share: %t}\n", share), Endpoints: eps}
	urls, pids, err := startFronts(ctx, ps, dir, fronts, fo)
	if err != nil {
		return nil, err
	}
	if err := sleepCtx(ctx, o.Warmup); err != nil {
		return nil, err
	}
	row := func(phase string) BackgroundRow {
		return BackgroundRow{Replicas: n, Fronts: fronts, Share: share, Phase: phase}
	}
	rest, err := measureBackground(ctx, reps, pids, o.Rest, nil, row("rest"))
	if err != nil {
		return nil, err
	}
	rps := o.LoadRPS
	if rps <= 0 {
		rps = n
	}
	load, err := measureBackground(ctx, reps, pids, o.Load, func(ctx context.Context) int64 { return driveDecisions(ctx, urls, rps) }, row("load"))
	if err != nil {
		return []BackgroundRow{rest}, err
	}
	return []BackgroundRow{rest, load}, nil
}

// startReplicas starts n cheap mock replicas in this process (r0, r1,
// ...) and returns them with their pool endpoint lines; the caller closes
// what it got, also on error.
func startReplicas(n int) (reps []*mock.Server, eps string, err error) {
	var b strings.Builder
	for i := range n {
		c := mock.DefaultConfig()
		c.Name = fmt.Sprintf("r%d", i)
		c.RequestLogSize = 0
		r, err := mock.New(c, nil)
		if err != nil {
			return reps, "", fmt.Errorf("mock: %w", err)
		}
		url, err := r.Start("127.0.0.1:0")
		if err != nil {
			return reps, "", fmt.Errorf("mock: %w", err)
		}
		reps = append(reps, r)
		fmt.Fprintf(&b, "          - {name: r%d, address: %s}\n", i, strings.TrimPrefix(url, "http://"))
	}
	return reps, b.String(), nil
}

func closeReplicas(reps []*mock.Server) {
	for _, r := range reps {
		_ = r.Close()
	}
}

// frontOptions are what every front of startFronts shares.
type frontOptions struct {
	Turnout string // binary
	NATS    string // cluster sync over this server ("": none)
	// Extra is top-level config YAML; Endpoints the pool's endpoint lines
	// (startReplicas).
	Extra, Endpoints string
}

// startFronts starts n turnout processes (front-0, ...) before one
// prefix-affinity pool and waits until each is ready and, with NATS,
// connected; it returns their URLs and pids.
func startFronts(ctx context.Context, ps *procSet, dir string, n int, o frontOptions) (urls []string, pids []int, err error) {
	for f := range n {
		listen, syslog, err := turnoutAddrs()
		if err != nil {
			return nil, nil, err
		}
		var b strings.Builder
		fmt.Fprintf(&b, "listen: %s\nsession_headers: [x-session-id]\nfeedback: {syslog: %s}\n", listen, syslog)
		if o.NATS != "" {
			fmt.Fprintf(&b, "cluster: {nats: %q, name: front-%d}\n", o.NATS, f)
		}
		b.WriteString(o.Extra)
		b.WriteString("deployments:\n  - name: bench\n    models: [llama]\n    policy: {name: prefix-affinity}\n    pools:\n      - role: mixed\n        endpoints:\n")
		b.WriteString(o.Endpoints)
		cfg := filepath.Join(dir, fmt.Sprintf("turnout-%d.yaml", f))
		if err := os.WriteFile(cfg, []byte(b.String()), 0o644); err != nil {
			return nil, nil, fmt.Errorf("front %d: %w", f, err)
		}
		p, err := ps.start(dir, fmt.Sprintf("turnout-%d", f), o.Turnout, "serve", "--config", cfg, "--watch", "0", "--log-level", "warn")
		if err != nil {
			return nil, nil, err
		}
		url := "http://" + listen
		if err := waitHTTP(ctx, p, url+contract.PathReadyz, http.StatusOK, 120*time.Second); err != nil {
			return nil, nil, err
		}
		if o.NATS != "" {
			if err := waitClusterConnected(ctx, url, 120*time.Second); err != nil {
				return nil, nil, err
			}
		}
		urls = append(urls, url)
		pids = append(pids, p.cmd.Process.Pid)
	}
	return urls, pids, nil
}

// measureBackground counts the replicas' requests and turnout's CPU over
// d, while drive (if any) runs.
func measureBackground(ctx context.Context, reps []*mock.Server, pids []int, d time.Duration, drive func(context.Context) int64, r BackgroundRow) (BackgroundRow, error) {
	sum := func() (s, h, m int64) {
		for _, rep := range reps {
			st := rep.Stats()
			s, h, m = s+st.Scrapes, h+st.HealthChecks, m+st.ModelPolls
		}
		return
	}
	cpu := func() (time.Duration, error) {
		var t time.Duration
		for _, p := range pids {
			c, err := procCPU(p)
			if err != nil {
				return 0, err
			}
			t += c
		}
		return t, nil
	}
	s0, h0, m0 := sum()
	c0, err := cpu()
	if err != nil {
		return r, err
	}
	start := time.Now()
	var decisions atomic.Int64
	var wg sync.WaitGroup
	dctx, stop := context.WithTimeout(ctx, d)
	defer stop()
	if drive != nil {
		wg.Add(1)
		go func() { defer wg.Done(); decisions.Store(drive(dctx)) }()
	}
	<-dctx.Done()
	wg.Wait()
	if ctx.Err() != nil {
		return r, ctx.Err()
	}
	secs := time.Since(start).Seconds()
	s1, h1, m1 := sum()
	c1, err := cpu()
	if err != nil {
		return r, err
	}
	per := float64(len(reps)) * secs
	r.Seconds, r.Decisions = secs, decisions.Load()
	r.Scrapes, r.Health, r.Models = float64(s1-s0)/per, float64(h1-h0)/per, float64(m1-m0)/per
	r.Cores = (c1 - c0).Seconds() / secs
	r.CPUms = (c1 - c0).Seconds() * 1e3 / per
	return r, nil
}

// driveDecisions asks the fronts (round robin) for rps decisions a
// second, each with a prompt of its own, and closes each at once over
// /internal/done; it returns the decisions made.
func driveDecisions(ctx context.Context, urls []string, rps int) int64 {
	const workers = 16
	c := &fasthttp.Client{MaxConnsPerHost: workers}
	var made atomic.Int64
	send := func(i int64, _ time.Time, req *fasthttp.Request, resp *fasthttp.Response) {
		url := urls[int(i)%len(urls)]
		req.Reset()
		req.SetRequestURI(url + contract.PathRoute)
		req.Header.SetMethod(fasthttp.MethodPost)
		req.Header.Set("X-Original-URI", "/v1/chat/completions")
		req.Header.Set("X-Original-Method", "POST")
		req.SetBodyString(fmt.Sprintf(`{"model":"llama","messages":[{"role":"user","content":"question %d: %x"}]}`, i, rand.Uint64()))
		if err := c.DoTimeout(req, resp, 5*time.Second); err != nil || resp.StatusCode() != fasthttp.StatusOK {
			return
		}
		id := string(resp.Header.Peek(contract.HdrDecision))
		if id == "" {
			return
		}
		made.Add(1)
		req.Reset()
		req.SetRequestURI(url + contract.PathDone + "?id=" + id)
		req.Header.SetMethod(fasthttp.MethodPost)
		_ = c.DoTimeout(req, resp, 5*time.Second)
	}
	pacedWorkers(ctx, workers, float64(rps), func() func(int64, time.Time, *fasthttp.Request, *fasthttp.Response) { return send })
	return made.Load()
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// WriteBackgroundTable renders the rows.
func WriteBackgroundTable(w io.Writer, rows []BackgroundRow) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "replicas\tfronts\tshare\tphase\tdecisions/s\tscrapes/replica/s\thealth/replica/s\tmodels/replica/s\tturnout CPU ms/replica/s\tturnout cores\terror\t")
	for _, r := range rows {
		dps := 0.0
		if r.Seconds > 0 {
			dps = float64(r.Decisions) / r.Seconds
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%.0f\t%.3f\t%.3f\t%.3f\t%.3f\t%.2f\t%s\t\n", r.Replicas, r.Fronts, onOff(r.Share), r.Phase, dps,
			r.Scrapes, r.Health, r.Models, r.CPUms, r.Cores, r.Err)
	}
	return tw.Flush()
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// ParseBools reads "on,off"-style lists.
func ParseBools(s string) ([]bool, error) {
	var out []bool
	for f := range strings.SplitSeq(s, ",") {
		switch strings.TrimSpace(f) {
		case "on", "true", "1":
			out = append(out, true)
		case "off", "false", "0":
			out = append(out, false)
		default:
			return nil, fmt.Errorf("%q is not on or off", f)
		}
	}
	return out, nil
}
