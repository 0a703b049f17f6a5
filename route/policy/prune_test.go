package policy

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"
	"gopkg.in/yaml.v3"
)

// pruneRig is a pool of n endpoints under one policy, with requests whose
// 32-block prompts share one of 16 heads (three quarters of the prompt).
type pruneRig struct {
	pool  *fleet.Pool
	pol   fleet.Policy
	reqs  []fleet.Request
	clock *fleet.StepClock // moved on by pickClockStep per decision
}

// pickClockStep is the rig's synthetic time between decisions (50,000 a
// second): the candidate index's passes run by decisions, not by how fast
// the benchmark runs (callgrind counts repeat run to run).
const pickClockStep = 20 * time.Microsecond

func newPruneRig(tb testing.TB, name string, n, maxCandidates int) *pruneRig {
	tb.Helper()
	pool := goldenPool(n)
	var pc config.PolicyConfig
	if err := yaml.Unmarshal([]byte("{name: "+name+"}"), &pc); err != nil {
		tb.Fatal(err)
	}
	pc.MaxCandidates = maxCandidates
	clock := &fleet.StepClock{}
	p, err := DefaultRegistry().Build(&pc, fleet.PolicyEnv{Pool: pool, Rand: fleet.NewRand(7), Clock: clock})
	if err != nil {
		tb.Fatal(err)
	}
	pool.Policy = p
	reqs := make([]fleet.Request, 512)
	for i := range reqs {
		var h uint64
		for k := range 32 {
			seed := uint64(i%16*1000 + k + 1)
			if k >= 24 {
				seed = uint64(1e6 + i*100 + k)
			}
			h = fleet.Mix64(h ^ seed)
			reqs[i].Blocks = append(reqs[i].Blocks, h)
		}
		s := fmt.Appendf(nil, "user-%d", i%64)
		reqs[i].Session, reqs[i].HasSession, reqs[i].SessionHash = s, true, fleet.HashKey(s)
	}
	for _, e := range pool.Endpoints {
		e.StartWindow()
	}
	return &pruneRig{pool: pool, pol: p, reqs: reqs, clock: clock}
}

// run makes decisions i..i+n, keeping open decisions per endpoint open
// bench times one decision at a time after warm decisions, keeping about
// 2 x the pool's size of decisions open (the oldest closed as each opens).
func (r *pruneRig) bench(b *testing.B, warm int) {
	open := make([]*fleet.Endpoint, 2*len(r.pool.Endpoints))
	r.run(b, 0, warm, open)
	dst := make([]*fleet.Endpoint, 0, 3)
	c := &fleet.Choice{}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		*c = fleet.Choice{Endpoints: dst}
		r.clock.Advance(pickClockStep)
		r.pol.Pick(&r.reqs[i%len(r.reqs)], r.pool, c)
		e := c.Endpoints[0]
		goldenOpen(e)
		k := i % len(open)
		if open[k] != nil {
			open[k].AddInflight(-1)
		}
		open[k] = e
	}
}

// (a ring of them) as a busy fleet would; it returns the first choices.
func (r *pruneRig) run(tb testing.TB, from, n int, open []*fleet.Endpoint) []*fleet.Endpoint {
	dst := make([]*fleet.Endpoint, 0, 3)
	c := &fleet.Choice{}
	firsts := make([]*fleet.Endpoint, 0, n)
	for i := from; i < from+n; i++ {
		*c = fleet.Choice{Endpoints: dst}
		r.clock.Advance(pickClockStep)
		r.pol.Pick(&r.reqs[i%len(r.reqs)], r.pool, c)
		if len(c.Endpoints) == 0 {
			tb.Fatalf("decision %d: nothing picked", i)
		}
		e := c.Endpoints[0]
		goldenOpen(e)
		k := i % len(open)
		if open[k] != nil {
			open[k].AddInflight(-1)
		}
		open[k] = e
		firsts = append(firsts, e)
	}
	return firsts
}

var prunePolicies = []string{LeastRequestType, SessionHashType, PrefixAffinityType, PredictedTTFTType, LoRAAffinityType}

// TestPruningOffAtOrBelowMaxCandidates: a pool of max_candidates
// endpoints or fewer gets no candidate index, and decides as one built
// with pruning far above its size.
func TestPruningOffAtOrBelowMaxCandidates(t *testing.T) {
	for _, name := range prunePolicies {
		a := newPruneRig(t, name, 64, 0)
		b := newPruneRig(t, name, 64, 4096)
		if policyPruned(a.pol) {
			t.Fatalf("%s: a 64-endpoint pool is pruned at the default max_candidates", name)
		}
		fa := a.run(t, 0, 2000, make([]*fleet.Endpoint, 128))
		fb := b.run(t, 0, 2000, make([]*fleet.Endpoint, 128))
		for i := range fa {
			if fa[i].Index != fb[i].Index {
				t.Fatalf("%s: decision %d: %s with the default max_candidates, %s without pruning", name, i, fa[i].Name, fb[i].Name)
			}
		}
	}
}

// TestPruningAt1024: the policies that prune build a candidate index at
// 1,024 endpoints, decide without allocating, and keep the pool balanced
// (no endpoint far above the mean of open decisions) and prefix hits
// where the prompt was sent.
func TestPruningAt1024(t *testing.T) {
	for _, name := range prunePolicies {
		t.Run(name, func(t *testing.T) {
			r := newPruneRig(t, name, 1024, 0)
			if !policyPruned(r.pol) {
				t.Fatalf("%s at 1,024 endpoints: no candidate index", name)
			}
			open := make([]*fleet.Endpoint, 2*1024)
			r.run(t, 0, 4096, open)
			dst := make([]*fleet.Endpoint, 0, 3)
			c := &fleet.Choice{}
			i := 0
			allocs := testing.AllocsPerRun(2000, func() {
				*c = fleet.Choice{Endpoints: dst}
				r.clock.Advance(pickClockStep)
				r.pol.Pick(&r.reqs[i%len(r.reqs)], r.pool, c)
				i++
			})
			if allocs != 0 {
				t.Fatalf("%s: %v allocations per decision", name, allocs)
			}
			var maxLoad int64
			for _, e := range r.pool.Endpoints {
				maxLoad = max(maxLoad, e.Load())
			}
			// 2 open decisions per endpoint on average.
			if maxLoad > 6 {
				t.Fatalf("%s: an endpoint holds %d open decisions, mean 2", name, maxLoad)
			}
		})
	}
}

// TestPruningKeepsPrefixHits: with pruning, a prompt goes back to the
// endpoint it was sent to however far that one sits from the least loaded
// (its holder is a candidate, not only the least loaded and the sampled).
func TestPruningKeepsPrefixHits(t *testing.T) {
	r := newPruneRig(t, PrefixAffinityType, 1024, 0)
	rec := r.pol.(fleet.PrefixRecorder)
	for _, e := range r.pool.Endpoints {
		e.AddInflight(1)
	}
	c := &fleet.Choice{Endpoints: make([]*fleet.Endpoint, 0, 3)}
	for i := range 100 {
		req := &r.reqs[i%16]
		holder := r.pool.Endpoints[(i*397+11)%1024]
		rec.RecordPrefix(holder.Index, req.Blocks)
		holder.AddInflight(2) // above the least loaded, within the guard
		c.Endpoints, c.Outcome, c.Matched = c.Endpoints[:0], 0, 0
		r.pol.Pick(req, r.pool, c)
		if c.Endpoints[0] != holder || c.Outcome != fleet.OutcomeAffinity || c.Matched != len(req.Blocks) {
			t.Fatalf("prompt %d: sent to %s (%s, %d blocks matched), its holder is %s", i, c.Endpoints[0].Name, c.Outcome, c.Matched, holder.Name)
		}
		holder.AddInflight(-2)
		r.pol.(*PrefixAffinity).Forget(holder.Index)
	}
}

// TestCandidateIndexConcurrent: decisions and completions on several
// goroutines while the index's pass runs (go test -race); afterwards the
// index's sums are the pool's.
func TestCandidateIndexConcurrent(t *testing.T) {
	for _, name := range []string{PrefixAffinityType, SessionHashType, LeastRequestType} {
		t.Run(name, func(t *testing.T) { testCandidateIndexConcurrent(t, name) })
	}
}

func testCandidateIndexConcurrent(t *testing.T, name string) {
	r := newPruneRig(t, name, 256, 0)
	if !policyPruned(r.pol) {
		t.Fatal("no candidate index at 256 endpoints")
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dst := make([]*fleet.Endpoint, 0, 3)
			c := &fleet.Choice{}
			for i := range 3000 {
				*c = fleet.Choice{Endpoints: dst}
				r.pol.Pick(&r.reqs[(g*7919+i)%len(r.reqs)], r.pool, c)
				if len(c.Endpoints) == 0 {
					t.Errorf("goroutine %d decision %d: nothing picked", g, i)
					return
				}
				goldenOpen(c.Endpoints[0])
				if i%3 != 0 {
					c.Endpoints[0].AddInflight(-1)
				}
				if i%500 == 0 {
					r.pool.Endpoints[(g*31+i)%256].SetDown(i%1000 == 0)
				}
			}
		}()
	}
	wg.Wait()
	for _, e := range r.pool.Endpoints {
		e.SetDown(false)
	}
	x := candidateIndexOf(r.pol)
	x.mu.Lock()
	x.scan(len(x.eps)) // finish the pass in progress
	x.scan(len(x.eps)) // and take a whole one
	x.mu.Unlock()
	var n, total int64
	var minLoad int64 = 1 << 62
	for _, e := range r.pool.Endpoints {
		n++
		total += e.Load()
		minLoad = min(minLoad, e.Load())
	}
	if got := x.n.Load(); got != n {
		t.Fatalf("index counts %d available, pool has %d", got, n)
	}
	if got := x.total.Load(); got != total {
		t.Fatalf("index total load %d, pool's %d", got, total)
	}
	if first := x.least[0].Load(); first == nil || first.Load() != minLoad {
		t.Fatalf("least loaded entry %v, pool minimum %d", first, minLoad)
	}
}

// TestMaxCandidatesValidated: out of range is a config error naming the key.
func TestMaxCandidatesValidated(t *testing.T) {
	_, err := config.ParseConfig([]byte("deployments:\n  - name: d\n    models: [m]\n    policy: {name: least-request, max_candidates: 4}\n    pools:\n      - endpoints: [{name: a, address: \"127.0.0.1:1\"}]\n"))
	if err == nil || !strings.Contains(err.Error(), "max_candidates") {
		t.Fatalf("max_candidates 4: %v", err)
	}
}

// profile is the profile a policy embeds (tests).
func (pr *Profile) profile() *Profile { return pr }

// candidateIndexOf is the candidate index a policy prunes with (nil: none).
func candidateIndexOf(p fleet.Policy) *CandidateIndex {
	switch p := p.(type) {
	case *SessionHash:
		if p.session.prune != nil {
			return p.session.prune.x
		}
	case interface{ profile() *Profile }:
		if pr := p.profile().prune; pr != nil {
			return pr.x
		}
	}
	return nil
}

func policyPruned(p fleet.Policy) bool { return candidateIndexOf(p) != nil }

// BenchmarkPickScale is one decision at 64 and 1,024 endpoints, with the
// default max_candidates and without pruning (max_candidates 65536).
func BenchmarkPickScale(b *testing.B) {
	for _, name := range prunePolicies {
		for _, n := range []int{64, 1024} {
			for _, mc := range []int{0, 1 << 16} {
				if n == 64 && mc != 0 {
					continue
				}
				b.Run(fmt.Sprintf("%s/%d/max_candidates=%d", name, n, mc), func(b *testing.B) {
					newPruneRig(b, name, n, mc).bench(b, 2*n+1000)
				})
			}
		}
	}
}

// TestCandidateIndexPassAgeByClock: the pass's age is read from the
// index's clock, not the wall's: while the clock stands still a decision
// scans one chunk, and once it has moved past passMaxAge since the last
// pass ended the next decision finishes the pass in progress.
func TestCandidateIndexPassAgeByClock(t *testing.T) {
	pool := goldenPool(1024)
	clock := &fleet.StepClock{}
	x := NewCandidateIndex(pool, 64, fleet.NewRand(3), clock)
	x.advance() // no pass ended yet: a whole one
	if !x.ended.Load() || x.pos != 0 {
		t.Fatalf("first decision: pass ended %v at %d, want a whole pass", x.ended.Load(), x.pos)
	}
	for i := 1; i <= 3; i++ {
		x.advance()
		if x.pos != i*x.chunk {
			t.Fatalf("decision %d on a still clock: pass at %d, want %d (one chunk each)", i, x.pos, i*x.chunk)
		}
	}
	clock.Advance(passMaxAge) // not past it yet
	x.advance()
	if x.pos != 4*x.chunk {
		t.Fatalf("at passMaxAge: pass at %d, want %d", x.pos, 4*x.chunk)
	}
	clock.Advance(time.Nanosecond)
	done := x.done.Load()
	x.advance()
	if x.pos != 0 || x.done.Load() != done+int64(passMaxAge)+1 {
		t.Fatalf("past passMaxAge: pass at %d, ended at %d, want 0 and %d", x.pos, x.done.Load(), done+int64(passMaxAge)+1)
	}
}
