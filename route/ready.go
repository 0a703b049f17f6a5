package route

import (
	"fmt"
	"strings"

	"github.com/turnout/turnout/route/fleet"
	"github.com/valyala/fasthttp"
)

// Readiness (/readyz) means "turnout can route every deployment now":
//
//   - with active health checks on, nothing is ready until the first round
//     has checked every endpoint (before it, an unreachable replica looks
//     exactly like a healthy one); then each pool needs at least min_ready
//     endpoints that passed a check and are not down;
//   - with health.disable there is no evidence either way, so each pool needs
//     min_ready endpoints that nothing has marked down.
//
// min_ready is health.min_ready (default 1), or the pool's own min_ready.

// ready answers /readyz: 200 or 503 with a one-line reason, and with
// ?verbose one line per pool.
func (s *Server) ready(ctx *fasthttp.RequestCtx) {
	defer s.readyFeedback(ctx) // ?verbose: feedback and degraded endpoints
	var b strings.Builder
	ok := s.WriteReadiness(&b, ctx.QueryArgs().Has("verbose"))
	ctx.SetContentType("text/plain; charset=utf-8")
	if ok {
		ctx.SetStatusCode(fasthttp.StatusOK)
	} else {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
	}
	ctx.SetBodyString(b.String())
}

// WriteReadiness writes the verdict line ("ready" or "not ready: why") and,
// when verbose, one line per pool; it reports whether turnout is ready.
// Other readiness facts append their own lines after these.
func (s *Server) WriteReadiness(b *strings.Builder, verbose bool) bool {
	snap := s.snap.Load()
	checks := !snap.Config.Health.Disable && snap.Config.Health.Interval > 0
	var why string
	if checks && !s.healthRound.Load() {
		why = "first health round not finished"
	}
	type poolLine struct {
		p          *fleet.Pool
		avail, min int
	}
	var pools []poolLine
	for _, p := range snap.Pools() {
		n := 0
		for _, e := range p.Endpoints {
			if e.Available() && (!checks || e.State.Checked.Load()) {
				n++
			}
		}
		pools = append(pools, poolLine{p, n, p.MinReady})
		if why == "" && n < p.MinReady {
			why = fmt.Sprintf("pool %s has %d available endpoints, needs %d", p.Name, n, p.MinReady)
		}
	}
	if why == "" {
		b.WriteString("ready\n")
	} else {
		b.WriteString("not ready: " + why + "\n")
	}
	if verbose {
		for _, l := range pools {
			verdict := "ok"
			if l.avail < l.min {
				verdict = "short"
			}
			fmt.Fprintf(b, "pool %s: %d/%d available, min_ready %d, %s\n", l.p.Name, l.avail, len(l.p.Endpoints), l.min, verdict)
		}
	}
	return why == ""
}
