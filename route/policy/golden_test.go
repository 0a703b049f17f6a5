package policy

import (
	"bufio"
	"bytes"
	"cmp"
	"container/heap"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"github.com/turnout/turnout/route/fleet"
	"github.com/turnout/turnout/route/internal/routetest"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	"gopkg.in/yaml.v3"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/kv"
	"github.com/turnout/turnout/route/payload"
)

// The decision goldens record what every policy chose for each request of
// the shared Mooncake trace, under a deterministic load model: they are the
// proof that a rewrite of the policies decides exactly as before. Regenerate
// with -update only when a decision change is intended.

var updateGolden = flag.Bool("update", false, "rewrite testdata/choices_*.golden")

// goldenRequests is how much of the trace the goldens replay (about 300 s
// of arrivals: enough for windows, churn and overload to come and go).
const goldenRequests = 1200

// goldenTrace reads the first goldenRequests lines of the shared Mooncake
// trace ($TRACES, else ../shared/traces from the repository root), or
// skips: the traces are not part of the repository.
func goldenTrace(t *testing.T) []traceLine {
	t.Helper()
	dir := os.Getenv("TRACES")
	if dir == "" {
		dir = filepath.Join("..", "..", "..", "shared", "traces") // ../shared/traces from the repository root
	}
	path := filepath.Join(dir, "mooncake_synthetic_trace.jsonl")
	f, err := os.Open(path)
	if err != nil {
		t.Skipf("shared trace not found (%v): set TRACES to the folder of mooncake_synthetic_trace.jsonl", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	var out []traceLine
	for sc.Scan() && len(out) < goldenRequests {
		var l traceLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("%s line %d: %v", path, len(out)+1, err)
		}
		out = append(out, l)
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return out
}

type traceLine struct {
	Timestamp float64  `json:"timestamp"`
	Input     int      `json:"input_length"`
	Output    int      `json:"output_length"`
	HashIDs   []uint64 `json:"hash_ids"`
}

// goldenCase is one replay setting of one policy.
type goldenCase struct {
	name   string
	policy string
	params string // YAML flow mapping, "" = defaults
	eps    int    // endpoints (default 4)
	// sessions: requests carry a session id (their first two hash ids).
	sessions bool
	// peers: other instances' decisions are counted on some endpoints.
	peers bool
	// engine: engine loads are published at every scrape (running +
	// waiting = in flight plus a deterministic offset).
	engine bool
	// churn: endpoints go down, drain and come back mid-way.
	churn bool
	// tokens: prompts are token ids (kv-aware's own path), and the chosen
	// replica's KV events are applied to the index.
	tokens bool
	// slots is how many endpoints a decision names (default 3: the
	// default fallbacks 2).
	slots int
}

var goldenCases = []goldenCase{
	{name: "default", policy: RoundRobinType},
	{name: "churn", policy: RoundRobinType, churn: true},

	{name: "default", policy: LeastRequestType},
	{name: "minimum", policy: LeastRequestType, params: "{choices: 0}", engine: true, peers: true},
	{name: "churn", policy: LeastRequestType, churn: true, sessions: true},
	{name: "single", policy: LeastRequestType, slots: 1, engine: true},

	{name: "default", policy: SessionHashType},
	{name: "sessions", policy: SessionHashType, sessions: true},
	{name: "overflow", policy: SessionHashType, params: "{load_factor: 1.05, min_inflight: 1, vnodes: 40}", sessions: true, engine: true, churn: true},

	{name: "default", policy: PrefixAffinityType},
	{name: "sessions", policy: PrefixAffinityType, sessions: true, peers: true},
	{name: "bounded", policy: PrefixAffinityType, params: "{bounded_load: 0.25}", sessions: true, peers: true, engine: true},
	{name: "guard", policy: PrefixAffinityType, params: "{balance_abs: 1, balance_rel: 1.1, match_threshold: 0.5, min_blocks: 3}", eps: 6, sessions: true, churn: true},
	{name: "single", policy: PrefixAffinityType, slots: 1, sessions: true, params: "{bounded_load: 0.5}"},
	{name: "nosession", policy: PrefixAffinityType, params: "{session_affinity: false, bounded_load: 1}", sessions: true, churn: true, engine: true},

	{name: "tokens", policy: KVAwareType, params: "{block_size: 4, tokenizer: {mode: none}}", tokens: true},
	{name: "guard", policy: KVAwareType, params: "{block_size: 4, balance_abs: 1, balance_rel: 1.1, load_weight: 0.5, tokenizer: {mode: none}}", tokens: true, engine: true, churn: true, peers: true},
	{name: "fallback", policy: KVAwareType, params: "{block_size: 4, tokenizer: {mode: none}, fallback: {block_bytes: 64}}", sessions: true, churn: true},
}

// completion is a decision in flight in the replay's load model.
type completion struct {
	at int64 // ms
	e  *fleet.Endpoint
}

type completions []completion

func (h completions) Len() int           { return len(h) }
func (h completions) Less(i, j int) bool { return h[i].at < h[j].at }
func (h completions) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *completions) Push(x any)        { *h = append(*h, x.(completion)) }
func (h *completions) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// goldenTokensPerID is how many token ids stand for one trace hash id in
// token prompts (kept small: the goldens test choices, not tokenizers).
const goldenTokensPerID = 8

func TestDecisionGoldens(t *testing.T) {
	t.Run("mooncake", func(t *testing.T) { testGoldens(t, goldenTrace(t), "") })
	// The generated trace always runs (CI has no shared traces).
	t.Run("synthetic", func(t *testing.T) { testGoldens(t, syntheticTrace(600), "_synthetic") })
}

// syntheticTrace is a Mooncake-like trace generated here: Poisson
// arrivals (about 4 a second), prompts that share one of 24 root documents
// (2 to 20 blocks) and add 1 to 8 blocks of their own.
func syntheticTrace(n int) []traceLine {
	rnd := fleet.NewRand(2026)
	out := make([]traceLine, 0, n)
	ms, next := 0.0, uint64(1_000_000)
	for range n {
		ms += -math.Log(1-float64(rnd.Intn(1<<20))/(1<<20)) * 250
		root := uint64(rnd.Intn(24))
		var ids []uint64
		for k := range 2 + root%19 {
			ids = append(ids, root*1000+k)
		}
		for range 1 + rnd.Intn(8) {
			ids = append(ids, next)
			next++
		}
		out = append(out, traceLine{Timestamp: ms, Input: len(ids)*512 - rnd.Intn(512), Output: 10 + rnd.Intn(300), HashIDs: ids})
	}
	return out
}

func testGoldens(t *testing.T, trace []traceLine, suffix string) {
	for _, gc := range goldenCases {
		t.Run(gc.policy+"/"+gc.name, func(t *testing.T) {
			got := replayGolden(t, gc, trace)
			path := filepath.Join("testdata", fmt.Sprintf("choices_%s_%s%s.golden", gc.policy, gc.name, suffix))
			if *updateGolden {
				if err := os.MkdirAll("testdata", 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				gl, wl := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
				for i := 0; i < min(len(gl), len(wl)); i++ {
					if gl[i] != wl[i] {
						t.Fatalf("%s: first difference at line %d:\n got %s\nwant %s", path, i+1, gl[i], wl[i])
					}
				}
				t.Fatalf("%s: %d lines, want %d", path, len(gl), len(wl))
			}
		})
	}
}

// replayGolden runs the trace through one policy and returns one line per
// request: index, chosen endpoints (best first), outcome, matched blocks.
func replayGolden(t *testing.T, gc goldenCase, trace []traceLine) []byte {
	t.Helper()
	n := gc.eps
	if n == 0 {
		n = 4
	}
	pool := goldenPool(n)
	var pc config.PolicyConfig
	if err := yaml.Unmarshal([]byte(fmt.Sprintf("{name: %s, params: %s}", gc.policy, cmp.Or(gc.params, "{}"))), &pc); err != nil {
		t.Fatal(err)
	}
	log := zerolog.Nop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pol, err := DefaultRegistry().Build(&pc, fleet.PolicyEnv{Pool: pool, Rand: fleet.NewRand(7), Log: &log, Ctx: ctx})
	if err != nil {
		t.Fatal(err)
	}
	pool.Policy = pol
	if s, ok := pol.(fleet.Starter); ok {
		s.Start(pool)
	}
	if c, ok := pol.(fleet.Closer); ok {
		defer c.Close()
	}
	var ix *kv.Index
	if k, ok := pol.(*KVAware); ok {
		ix = k.Index()
	}
	blockBytes := 0
	if pu, ok := pol.(fleet.PromptUser); ok {
		blockBytes = pu.BlockBytes()
	}

	var (
		out      bytes.Buffer
		inflight completions
		lastWin  int64 = -1 << 62
		lastScr  int64 = -1 << 62
		blocks   []uint64
		toks     []uint32
		body     []byte
		idx      payload.Index
	)
	for i, l := range trace {
		now := int64(l.Timestamp)
		for len(inflight) > 0 && inflight[0].at <= now {
			heap.Pop(&inflight).(completion).e.AddInflight(-1)
		}
		if now-lastScr >= 250 { // the scraper's default interval
			lastScr = now
			for j, e := range pool.Endpoints {
				if gc.engine {
					e.SetEngineLoad(&fleet.EngineLoad{Requests: e.Inflight() + int64((i+j)%3), KVUsage: -1, Mark: e.DecisionMark()})
				}
			}
			if now-lastWin >= 2000 { // windows span 8 scrapes
				lastWin = now
				for _, e := range pool.Endpoints {
					e.StartWindow()
				}
			}
		}
		if gc.churn {
			goldenChurn(pool, i)
		}
		if gc.peers && i%3 == 0 {
			pool.Endpoints[(i/3)%n].NotePeerDecision()
		}

		// The request: chained block hashes (4 per trace hash id), or a
		// token-id / text body for kv-aware.
		r := fleet.Request{Model: []byte("m")}
		if gc.sessions {
			sess := "s" + strconv.FormatUint(l.HashIDs[0], 10)
			if len(l.HashIDs) > 1 {
				sess += "-" + strconv.FormatUint(l.HashIDs[1], 10)
			}
			r.Session, r.HasSession, r.SessionHash = []byte(sess), true, fleet.HashKey([]byte(sess))
		}
		blocks, toks, body = blocks[:0], toks[:0], body[:0]
		switch {
		case gc.tokens:
			for _, id := range l.HashIDs {
				for k := 0; k < goldenTokensPerID; k++ {
					toks = append(toks, uint32(id*goldenTokensPerID)+uint32(k)+1)
				}
			}
			body = append(body, `{"model":"m","prompt":[`...)
			for k, tk := range toks {
				if k > 0 {
					body = append(body, ',')
				}
				body = strconv.AppendUint(body, uint64(tk), 10)
			}
			body = append(body, "]}"...)
		case ix != nil: // kv-aware without token ids: its prefix fallback hashes the text
			body = append(body, `{"model":"m","prompt":"`...)
			for _, id := range l.HashIDs {
				body = fmt.Appendf(body, "chunk-%08d-%s ", id, strings.Repeat("x", 40))
			}
			body = append(body, `"}`...)
		case blockBytes > 0:
			var h uint64
			for _, id := range l.HashIDs {
				for k := uint64(0); k < 4; k++ {
					h = fleet.Mix64(h ^ (id*4 + k + 1))
					blocks = append(blocks, h)
				}
			}
			r.Blocks, r.PromptBytes = blocks, l.Input*4
		}
		if len(body) > 0 {
			idx.Build(body, false)
			r.Payload = &idx
		}

		c := fleet.Choice{Endpoints: make([]*fleet.Endpoint, 0, cmp.Or(gc.slots, 3))}
		pol.Pick(&r, pool, &c)
		fmt.Fprintf(&out, "%d %s %s %d", i, routetest.Names(c.Endpoints), c.Outcome, c.Matched)
		if c.Reject != fleet.RejectNone {
			fmt.Fprintf(&out, " reject=%d", c.Reject)
		}
		out.WriteByte('\n')
		if len(c.Endpoints) == 0 {
			continue
		}
		e := c.Endpoints[0]
		goldenOpen(e)
		dur := int64(l.Input/4 + max(l.Output, 1)*30)
		heap.Push(&inflight, completion{at: now + dur, e: e})
		if ix != nil && len(toks) >= 4 {
			keys := kv.BlockKeys(toks, 4, nil)
			ix.Apply(e.Name, kv.Batch{Events: []kv.Event{{Kind: kv.EventBlockStored, BlockHashes: keys, TokenIDs: toks[:len(keys)*4], BlockSize: 4}}})
		}
	}
	return out.Bytes()
}

// goldenChurn takes endpoints down, drains one and brings them back at
// fixed points of the replay.
func goldenChurn(p *fleet.Pool, i int) {
	switch i {
	case 200:
		p.Endpoints[1].SetDown(true)
	case 350:
		p.Endpoints[1].SetDown(false)
		p.Endpoints[0].Draining = true
	case 500:
		p.Endpoints[2].SetDown(true)
		p.Endpoints[3].SetDown(true)
	case 520:
		for _, e := range p.Endpoints {
			e.SetDown(true) // nothing available for a while
		}
	case 540:
		for _, e := range p.Endpoints {
			e.SetDown(false)
		}
		p.Endpoints[0].Draining = false
	case 800:
		p.Endpoints[len(p.Endpoints)-1].SetDown(true)
	case 950:
		p.Endpoints[len(p.Endpoints)-1].SetDown(false)
	}
}

// BenchmarkPick is the cost of one policy decision alone (no transport, no
// prompt hashing) over the first 64 trace requests, with sessions and
// engine loads, each decision completed at once so loads stay flat.
func BenchmarkPick(b *testing.B) {
	for _, pol := range []string{RoundRobinType, LeastRequestType, SessionHashType, PrefixAffinityType} {
		b.Run(pol, func(b *testing.B) {
			pool := goldenPool(4)
			var pc config.PolicyConfig
			if err := yaml.Unmarshal([]byte("{name: "+pol+"}"), &pc); err != nil {
				b.Fatal(err)
			}
			p, err := DefaultRegistry().Build(&pc, fleet.PolicyEnv{Pool: pool, Rand: fleet.NewRand(7)})
			if err != nil {
				b.Fatal(err)
			}
			reqs := make([]fleet.Request, 64)
			for i := range reqs {
				var h uint64
				for k := 0; k < 40; k++ {
					h = fleet.Mix64(h ^ uint64(i%7*1000+k+1))
					reqs[i].Blocks = append(reqs[i].Blocks, h)
				}
				s := []byte(fmt.Sprintf("user-%d", i%13))
				reqs[i].Session, reqs[i].HasSession, reqs[i].SessionHash = s, true, fleet.HashKey(s)
			}
			for j, e := range pool.Endpoints {
				e.AddInflight(int64(j % 3))
				e.StartWindow()
			}
			dst := make([]*fleet.Endpoint, 0, 3)
			c := &fleet.Choice{}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				*c = fleet.Choice{Endpoints: dst}
				p.Pick(&reqs[i%len(reqs)], pool, c)
				if len(c.Endpoints) > 0 {
					goldenOpen(c.Endpoints[0])
					c.Endpoints[0].AddInflight(-1)
				}
			}
		})
	}
}
