package bench

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/fleet"
	"github.com/turnout/turnout/route/policy"
)

// The in-process axis of the scale envelope (docs/scale.md): one Decider
// per cell (policy x endpoints x prompt size x indexed blocks), decided on
// one goroutine so 1e9 / ns-per-decision is the rate of one core. Nothing
// is on the network: the cell measures the decision core alone, what every
// transport adds its own cost to.

// ScaleOptions chooses the cells of RunScale.
type ScaleOptions struct {
	Policies  []string // turnout policy names
	Endpoints []int    // endpoints in the pool
	PromptKiB []int    // prompt sizes
	// Blocks are index sizes to fill before timing, for the policies that
	// hash prompts (others run once at 0): the blocks the prefix index holds
	// across the pool, up to its capacity.
	Blocks    []int
	Decisions int // timed decisions per cell
	// Open is how many decisions stay open (in flight) while timing, per
	// endpoint: the loads policies balance differ as in a busy fleet.
	Open int
	// MaxCandidates is the policies' max_candidates (0: the default).
	MaxCandidates int
	Seed          uint64
	Log           *zerolog.Logger
}

// DefaultScaleOptions are the grid of docs/scale.md.
func DefaultScaleOptions() ScaleOptions {
	return ScaleOptions{
		Policies:  []string{policy.RoundRobinType, policy.LeastRequestType, policy.SessionHashType, policy.PrefixAffinityType, "predicted-ttft", "lora-affinity", "kv-aware"},
		Endpoints: []int{16, 64, 256, 1024},
		PromptKiB: []int{2, 8, 32, 256},
		Blocks:    []int{0},
		Decisions: 20000,
		Open:      2,
		Seed:      1,
	}
}

// ScaleRow is one cell's result.
type ScaleRow struct {
	Policy                 string
	Endpoints, PromptKiB   int
	Blocks                 int     // blocks indexed when timing started (prefix-keyed policies)
	NsPerDecision          float64 // mean wall time over the timed decisions
	PerCore                float64 // decisions per CPU-second of the deciding thread
	P50Us, P99Us           float64 // per-decision time
	AllocsPerDecision      float64
	HeapMiB, BytesPerBlock float64 // live heap after filling; its growth per indexed block
	Err                    string
}

// scaleConfig is a one-deployment, one-pool config of n endpoints that are
// never called (health and feedback off).
func scaleConfig(policyName string, n, blockBytes, capacity, maxCandidates int) string {
	var b strings.Builder
	b.WriteString("health: {disable: true}\nfeedback: {disable: true}\nsession_headers: [x-session-id]\ndeployments:\n  - name: llama\n    models: [llama]\n")
	fmt.Fprintf(&b, "    policy: {name: %s", policyName)
	if maxCandidates != 0 {
		fmt.Fprintf(&b, ", max_candidates: %d", maxCandidates)
	}
	switch policyName {
	case policy.PrefixAffinityType, "predicted-ttft":
		fmt.Fprintf(&b, ", params: {block_bytes: %d, capacity_blocks: %d}", blockBytes, capacity)
	}
	b.WriteString("}\n")
	b.WriteString("    pools:\n      - endpoints:\n")
	for i := range n {
		fmt.Fprintf(&b, "          - {name: r%d, address: \"10.%d.%d.%d:8000\"}\n", i, i>>16&255, i>>8&255, i&255)
	}
	return b.String()
}

// scaleBodies are distinct chat bodies of about kib KiB: a system prompt
// shared by a sixteenth of them (the prefix a policy can follow) and a
// user turn of their own.
func scaleBodies(n, kib int, salt string) [][]byte {
	size := kib << 10
	out := make([][]byte, n)
	for i := range out {
		sys := strings.Repeat(fmt.Sprintf("System prompt %d of tenant %s: be brief and exact. ", i%16, salt), size*3/4/40+1)[:size*3/4]
		user := strings.Repeat(fmt.Sprintf("Question %d-%s about the document. ", i, salt), size/4/32+1)[:size/4]
		out[i] = fmt.Appendf(nil, `{"model":"llama","messages":[{"role":"system","content":%q},{"role":"user","content":%q}],"stream":true}`, sys, user)
	}
	return out
}

// indexedBlocks sums the prefix index over the pool's endpoints, when the
// policy keeps one.
func indexedBlocks(d *route.Decider) int {
	type cached interface{ CachedBlocks(int) int }
	n := 0
	for _, p := range d.Snapshot().Pools() {
		if c, ok := p.Policy.(cached); ok {
			for i := range p.Endpoints {
				n += c.CachedBlocks(i)
			}
		}
	}
	return n
}

// hashesPrompts reports whether the policy, at its defaults, keeps a
// prefix index to fill.
func hashesPrompts(name string) bool {
	return policy.ReadsPrompt(&config.PolicyConfig{Name: name}) && name != policy.KVAwareType
}

// RunScale measures every cell of o, in order, and returns one row each.
func RunScale(ctx context.Context, o ScaleOptions) ([]ScaleRow, error) {
	if o.Decisions <= 0 || len(o.Policies) == 0 || len(o.Endpoints) == 0 || len(o.PromptKiB) == 0 {
		return nil, fmt.Errorf("bench scale: policies, endpoints, prompt sizes and decisions are required")
	}
	var rows []ScaleRow
	for _, pol := range o.Policies {
		blocks := []int{0}
		if hashesPrompts(pol) && len(o.Blocks) > 0 {
			blocks = o.Blocks
		}
		for _, n := range o.Endpoints {
			for _, kib := range o.PromptKiB {
				for _, nb := range blocks {
					if err := ctx.Err(); err != nil {
						return rows, err
					}
					r := scaleCell(o, pol, n, kib, nb)
					if o.Log != nil {
						o.Log.Info().Str("policy", pol).Int("endpoints", n).Int("prompt_kib", kib).Int("blocks", r.Blocks).
							Float64("per_core", r.PerCore).Float64("p99_us", r.P99Us).Str("err", r.Err).Msg("scale cell")
					}
					rows = append(rows, r)
				}
			}
		}
	}
	return rows, nil
}

// scaleClockStep is how far the policies' clock moves per decision: a
// synthetic clock (50,000 decisions a second, the per-core goal in process),
// so what a decision does by the clock (the candidate index's pass age)
// is the same in every run, whatever the decisions' own speed.
const scaleClockStep = 20 * time.Microsecond

func scaleCell(o ScaleOptions, pol string, n, kib, wantBlocks int) ScaleRow {
	row := ScaleRow{Policy: pol, Endpoints: n, PromptKiB: kib}
	const blockBytes = 256
	// Room for the blocks asked for, spread over the pool, and the timed prompts.
	capacity := max(131072, 2*wantBlocks/n)
	cfg, err := config.ParseConfig([]byte(scaleConfig(pol, n, blockBytes, capacity, o.MaxCandidates)))
	if err != nil {
		row.Err = err.Error()
		return row
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	clock := &fleet.StepClock{}
	d, err := route.New(cfg, route.Options{Seed: o.Seed, Clock: clock})
	if err != nil {
		row.Err = err.Error()
		return row
	}
	var in contract.Input
	var v contract.Verdict
	sessionHdr := []byte("x-session-id")
	decide := func(body, session []byte) {
		in.Reset()
		if session != nil {
			in.AddHeader(sessionHdr, session)
		}
		in.Body = body
		clock.Advance(scaleClockStep)
		d.Decide(&in, &v)
	}
	// Fill the index with prompts of 8 KiB (32 blocks each), closed at once.
	for i := 0; indexedBlocks(d) < wantBlocks && i < 4*wantBlocks/32+1; i += 256 {
		for _, b := range scaleBodies(256, 8, fmt.Sprint("fill", i)) {
			decide(b, nil)
			d.Ledger().Complete(v.Decision)
		}
	}
	row.Blocks = indexedBlocks(d)
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	row.HeapMiB = float64(after.HeapAlloc) / (1 << 20)
	if row.Blocks > 0 {
		row.BytesPerBlock = (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / float64(row.Blocks)
	}

	bodies := scaleBodies(max(16, min(512, (64<<10)/kib)), kib, "timed")
	sessions := make([][]byte, 64)
	for i := range sessions {
		sessions[i] = fmt.Appendf(nil, "s%d", i)
	}
	open := make([]uint64, max(1, o.Open*n))
	step := func(i int) {
		decide(bodies[i%len(bodies)], sessions[i%len(sessions)])
		if !v.Routed() {
			row.Err = fmt.Sprintf("not routed: status %d", v.Status)
		}
		k := i % len(open)
		if open[k] != 0 {
			d.Ledger().Complete(open[k])
		}
		open[k] = v.Decision
	}
	for i := range len(open) + 1000 { // warm: pools, caches, the open window
		step(i)
	}
	times := make([]float64, o.Decisions)
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	// The thread's CPU time, not the wall clock's: on a shared box the
	// wall clock counts other processes' time slices too.
	runtime.LockOSThread()
	start, cpu0 := time.Now(), threadCPU()
	for i := range o.Decisions {
		t0 := time.Now()
		step(i)
		times[i] = float64(time.Since(t0).Nanoseconds())
	}
	total, cpu := time.Since(start), threadCPU()-cpu0
	runtime.UnlockOSThread()
	runtime.ReadMemStats(&m1)
	row.NsPerDecision = float64(total.Nanoseconds()) / float64(o.Decisions)
	row.PerCore = 1e9 / row.NsPerDecision
	if cpu > 0 {
		row.PerCore = float64(o.Decisions) / cpu.Seconds()
	}
	row.AllocsPerDecision = float64(m1.Mallocs-m0.Mallocs) / float64(o.Decisions)
	slices.Sort(times)
	row.P50Us = times[len(times)/2] / 1e3
	row.P99Us = times[len(times)*99/100] / 1e3
	runtime.KeepAlive(d)
	return row
}

// WriteScaleTable prints the rows for a terminal.
func WriteScaleTable(w io.Writer, rows []ScaleRow) error {
	return writeTable(w, "policy\tendpoints\tprompt KiB\tblocks\tdecisions/s/core\tp50 µs\tp99 µs\tallocs\theap MiB\tB/block\terror\t", len(rows), func(tw io.Writer, i int) {
		r := &rows[i]
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.0f\t%.1f\t%.1f\t%.2f\t%.1f\t%.0f\t%s\t\n",
			r.Policy, r.Endpoints, r.PromptKiB, r.Blocks, r.PerCore, r.P50Us, r.P99Us, r.AllocsPerDecision, r.HeapMiB, r.BytesPerBlock, r.Err)
	})
}
