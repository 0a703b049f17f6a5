package route

import (
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/feeds"
	"github.com/turnout/turnout/route/fleet"
	"github.com/turnout/turnout/route/models"
)

// Readiness (/readyz) means "turnout can route some model now", so one
// model whose replicas are all gone does not take the others out of a
// Service whose readiness follows /readyz:
//
//   - with active health checks on, nothing is ready until the first round
//     has checked every endpoint (before it, an unreachable replica looks
//     exactly like a healthy one); an endpoint counts once it passed a
//     check and is not down, degraded or draining;
//   - with health.disable there is no evidence either way, so an endpoint
//     counts unless something marked it down;
//   - an endpoint that passed its check but whose model list (GET
//     /v1/models) is not known yet does not count, for at most
//     health.models_wait after it came up (fleet.Endpoint.ModelsPending),
//     and until turnout was first ready, /readyz waits for every such
//     list: before it, a request for one of its adapters would be refused;
//   - a model is ready when every pool its decision picks from has at
//     least min_ready counted endpoints that serve it (the pool's
//     min_ready, else health.min_ready, else 1; 0: the pool may be empty);
//     a pool is ready when it has min_ready counted endpoints;
//   - turnout is ready when at least one deployment's model is.

// poolReady is one pool's readiness.
type poolReady struct {
	pool                *fleet.Pool
	avail, pending, min int
}

func (p *poolReady) ok() bool { return p.avail >= p.pool.MinReady }

// modelReady is one deployment model's readiness.
type modelReady struct {
	dep   *Deployment
	name  string
	entry *models.Entry
	avail int    // counted endpoints of the serving pool that serve it
	short string // why not ready ("" when ready)
}

// readiness is what /readyz and the readiness metrics report.
type readiness struct {
	checks, rounded bool
	wait            time.Duration
	pools           []poolReady
	models          []modelReady
	pending         []*fleet.Endpoint // waiting for their first model list
	anyModel        bool
	table           *models.Table // the model table judged
}

// judgeReadiness judges snap at now; rounded: the first health round
// finished.
func judgeReadiness(snap *Snapshot, rounded bool, now time.Time) *readiness {
	hc := &snap.Config.Health
	r := &readiness{
		checks:  !hc.Disable && hc.Interval > 0,
		rounded: rounded,
		wait:    hc.ModelsWaitOr(),
	}
	ns := now.UnixNano()
	counts := func(e *fleet.Endpoint) bool {
		return e.Available() && (!r.checks || e.State.Checked.Load()) && !e.ModelsPending(ns, r.wait)
	}
	for _, p := range snap.Pools() {
		pr := poolReady{pool: p, min: p.MinReady}
		for _, e := range p.Endpoints {
			switch {
			case counts(e):
				pr.avail++
			case e.ModelsPending(ns, r.wait):
				pr.pending++
				r.pending = append(r.pending, e)
			}
		}
		r.pools = append(r.pools, pr)
	}
	t := snap.models.Load()
	r.table = t
	for i, name := range t.Names {
		if t.IsAdapter(int32(i)) {
			break // adapters come after every deployment model
		}
		e := t.Lookup([]byte(name))
		dep := snap.Deployments[e.Dep]
		mr := modelReady{dep: dep, name: name, entry: e}
		for pi, pass := range dep.Passes {
			n := 0
			for k, ep := range pass.Pool.Endpoints {
				if (pi >= models.MaxProfiles || e.Only[pi].Has(k)) && counts(ep) {
					n++
				}
			}
			if pi == 0 {
				mr.avail = n
			}
			if n < pass.Pool.MinReady && mr.short == "" {
				mr.short = fmt.Sprintf("pool %s has %d available endpoints serving it, needs %d", pass.Pool.Name, n, pass.Pool.MinReady)
			}
		}
		r.anyModel = r.anyModel || mr.short == ""
		r.models = append(r.models, mr)
	}
	return r
}

// why is the reason turnout is not ready ("" when it is); latched: it
// was ready before, so new endpoints' lists are not waited for.
func (r *readiness) why(latched bool) string {
	switch {
	case r.checks && !r.rounded:
		return "first health round not finished"
	case !latched && len(r.pending) > 0:
		return fmt.Sprintf("waiting for the model list (GET /v1/models) of %d endpoint(s), first %s (at most health.models_wait %v after each came up)",
			len(r.pending), r.pending[0].Name, r.wait)
	case !r.anyModel && len(r.models) == 0:
		return "no model is routable: no deployment"
	case !r.anyModel:
		return "no model is routable: model " + r.models[0].name + ": " + r.models[0].short
	}
	return ""
}

// WriteReadiness writes the verdict line ("ready" or "not ready: why") and,
// when verbose, one line per pool and per model; it reports whether
// turnout is ready. Other readiness facts append their own lines after
// these.
func (d *Decider) WriteReadiness(b *strings.Builder, verbose bool) bool {
	snap := d.snap.Load()
	now := time.Now()
	r := judgeReadiness(snap, d.health.HealthRounded(), now)
	why := r.why(d.wasReady.Load())
	if why == "" {
		d.wasReady.Store(true)
		b.WriteString("ready\n")
	} else {
		b.WriteString("not ready: " + why + "\n")
	}
	if verbose {
		for _, l := range r.pools {
			verdict := "ok"
			if !l.ok() {
				verdict = "short"
			}
			waiting := ""
			if l.pending > 0 {
				waiting = fmt.Sprintf(", %d waiting for its model list", l.pending)
			}
			fmt.Fprintf(b, "pool %s: %d/%d available%s, min_ready %d, %s\n", l.pool.Name, l.avail, len(l.pool.Endpoints), waiting, l.min, verdict)
		}
		writeModelLines(b, snap, r)
		writeTTFTErrorReadiness(b, snap)
		for _, e := range r.pending {
			fmt.Fprintf(b, "endpoint %s: up %v, model list not known yet (GET /v1/models retried)\n", e.Name, now.Sub(time.Unix(0, e.State.UpAt.Load())).Round(time.Millisecond))
		}
	}
	return why == ""
}

// maxModelLines bounds /readyz?verbose's model lines (a fleet may have
// thousands of adapters).
const maxModelLines = 500

// writeModelLines writes one /readyz?verbose line per model name: which
// endpoints of its serving pool serve it and how many of those are
// available; a deployment model says whether it is ready (its pools at
// min_ready), an adapter whether a request for it would be refused.
func writeModelLines(b *strings.Builder, snap *Snapshot, r *readiness) {
	t := r.table
	for i, name := range t.Names {
		if i == maxModelLines {
			fmt.Fprintf(b, "models: %d more (turnout_model_decisions_total lists every one)\n", len(t.Names)-i)
			break
		}
		e := t.Lookup([]byte(name))
		pool := snap.Deployments[e.Dep].Serve
		var on []string
		avail := 0
		for i, ep := range pool.Endpoints {
			if e.Only[0].Has(i) {
				on = append(on, ep.Name)
				if ep.Available() {
					avail++
				}
			}
		}
		kind, verdict := "model", "ok"
		if i < len(r.models) {
			m := &r.models[i]
			avail = m.avail
			if m.short != "" {
				verdict = "not ready: " + m.short
			}
		} else {
			kind = "adapter"
			switch {
			case e.Refuse == models.RefuseUnknown:
				verdict = "not served (404)"
			case avail == 0:
				verdict = "unavailable (503)"
			}
		}
		fmt.Fprintf(b, "%s %s: served by %d/%d of pool %s [%s], %d available, %s\n", kind, name, len(on), len(pool.Endpoints), pool.Name, strings.Join(on, " "), avail, verdict)
	}
}

// writeReadinessMetrics writes turnout_pool_ready and turnout_model_ready
// (0/1 for every pool and deployment model, from the start).
func writeReadinessMetrics(b *strings.Builder, snap *Snapshot, rounded bool) {
	r := judgeReadiness(snap, rounded, time.Now())
	b.WriteString("# HELP turnout_pool_ready 1 when the pool has min_ready available endpoints whose model lists are known (/readyz?verbose).\n# TYPE turnout_pool_ready gauge\n")
	for _, p := range r.pools {
		fmt.Fprintf(b, "turnout_pool_ready{deployment=%q,pool=%q} %d\n", p.pool.Deployment, p.pool.Name, b2i(p.ok()))
	}
	b.WriteString("# HELP turnout_model_ready 1 when every pool the model's decision picks from has min_ready available endpoints serving it; turnout is ready while one model is.\n# TYPE turnout_model_ready gauge\n")
	for _, m := range r.models {
		fmt.Fprintf(b, "turnout_model_ready{deployment=%q,model=%q} %d\n", m.dep.Name, m.name, b2i(m.short == ""))
	}
}

func b2i(v bool) int {
	if v {
		return 1
	}
	return 0
}

// listsPending returns a deployment with an endpoint whose model list is
// unknown (fleet.Endpoint.ModelsUnknown): deployment di, or any when di is
// -1; nil when none. A model no known list names may be one of that
// endpoint's adapters, so it is answered 503, not 404. Off the routed
// path: only before a 404.
func (s *Snapshot) listsPending(di int32) *Deployment {
	hc := &s.Config.Health
	checks := !hc.Disable && hc.Interval > 0
	if !checks {
		return nil
	}
	now := time.Now().UnixNano()
	wait := hc.ModelsWaitOr()
	for i, d := range s.Deployments {
		if di >= 0 && int32(i) != di {
			continue
		}
		for _, p := range d.Pools {
			for _, e := range p.Endpoints {
				if e.ModelsUnknown(now, wait, checks) {
					return d
				}
			}
		}
	}
	return nil
}

// refuseListsPending answers 503 with Retry-After for a model no known
// list names while some of dep's endpoints' lists are not known yet.
func (t *Txn) refuseListsPending(v *contract.Verdict, dep *Deployment, model []byte) {
	v.RetryAfter = true
	v.Refuse(503, "service_unavailable", contract.ReasonModelUnavailable,
		"the model `"+string(cut(model, maxEchoModel))+"` is not listed yet: the model lists of deployment "+dep.Name+"'s endpoints are still being read; retry")
}

// signalsReadiness writes the live snapshot's signal feeds into
// /readyz?verbose (route/feeds).
func signalsReadiness(live *atomic.Pointer[Snapshot]) func(*strings.Builder) {
	return func(b *strings.Builder) {
		if snap := live.Load(); snap != nil {
			feeds.WriteReadiness(snap.Config, snap.Pools(), b)
		}
	}
}
