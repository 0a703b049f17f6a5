package health

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/fleet"
)

// The served-model poll (VerifyServedModels, below, refuses at load what
// answering replicas lack): every endpoint whose models are not pinned is
// asked GET /v1/models each health.models_interval, at once after a
// reload and when a health check finds it up, and again after a short
// backoff (repollFirst, doubling up to 5 s) while it passes its health
// checks but its poll fails: readiness and adapter requests wait for that list
// (fleet.Endpoint.ModelsPending), so it must not wait a whole interval.
// What it lists (base models and LoRA adapters with their parent) becomes
// the endpoint's fleet.ServedModels; a change rebuilds the model table
// (route/models), so a request goes only where its model is served. A
// deployment name a replica lacks is also logged, once per change, with
// the fixes that do not misroute, and counted in
// turnout_endpoint_model_missing. Never on the decision path: one small
// GET per endpoint per interval, at most modelPollers at once.

// modelCheck remembers, per endpoint, what was found.
type modelCheck struct {
	mu      sync.Mutex
	listed  map[string]string   // endpoint|address -> the last list, joined (warn on change)
	missing map[string][]string // endpoint -> missing names (sorted)
	polls   [2]uint64           // answered, failed
	changes uint64
	// sched is each endpoint's place in the poll, by its State (which
	// survives reloads); only the poll loop's goroutine touches it.
	sched map[*fleet.State]*pollSched
}

// pollSched is one endpoint's place in the served-model poll.
type pollSched struct {
	next    time.Time // when it is asked again
	fails   int       // consecutive failed polls
	ok      bool      // the last poll was answered
	overdue bool      // readiness stopped waiting for its list (logged once)
}

// ServedModelsPath is where replicas list the model names they accept.
const ServedModelsPath = "/v1/models"

// modelPollers bounds the concurrent /v1/models calls.
const modelPollers = 8

// repollFirst is the first wait before asking a healthy endpoint whose
// poll failed again; it doubles per failure up to repollMax (or the
// interval, when shorter).
const (
	repollFirst = 200 * time.Millisecond
	repollMax   = 5 * time.Second
)

// repollAfter is the wait after fails consecutive failed polls of an
// endpoint that passes its health checks.
func repollAfter(fails int, every time.Duration) time.Duration {
	d := repollFirst
	for i := 1; i < fails && d < repollMax; i++ {
		d *= 2
	}
	return min(d, repollMax, every)
}

// CheckServedModels polls every endpoint's served models each interval (0:
// the config's health.models_interval), after each reload and when an
// endpoint comes up, until ctx ends.
func (c *Checker) CheckServedModels(ctx context.Context, interval time.Duration) {
	mc := &modelCheck{listed: map[string]string{}, missing: map[string][]string{}, sched: map[*fleet.State]*pollSched{}}
	c.d.Extras().AddMetrics(mc.writeMetrics)
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 1, DisableCompression: true}}
	wake := make(chan struct{}, 1)
	c.d.OnApply(func(_ *route.Snapshot) {
		select {
		case wake <- struct{}{}:
		default:
		}
	})
	all, up := true, false
	for {
		next := c.checkModelsOnce(ctx, client, mc, interval, all, up)
		all, up = false, false
		t := time.NewTimer(time.Until(next))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-wake:
			all = true
		case <-c.upWake:
			up = true
		case <-t.C:
		}
		t.Stop()
	}
}

// checkModelsOnce asks the endpoints that are due (all: every one; up:
// also every healthy one whose last poll failed or never ran) and returns
// when the next one is due.
func (c *Checker) checkModelsOnce(ctx context.Context, client *http.Client, mc *modelCheck, interval time.Duration, all, up bool) time.Time {
	snap := c.d.Snapshot()
	hc := &snap.Config.Health
	every := interval
	if every <= 0 {
		every = hc.ModelsEvery()
	}
	checksOff := hc.Disable || hc.Interval.D() <= 0
	healthy := func(e *fleet.Endpoint) bool { return e.Available() && (checksOff || e.State.SeenUp.Load()) }
	type polled struct {
		e       *fleet.Endpoint
		st      *pollSched
		changed bool
		err     error
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, modelPollers)
	var results []*polled
	seen := map[*fleet.State]bool{}
	now := time.Now()
	for _, d := range snap.Deployments {
		want := d.Config.Models
		for _, p := range d.Pools {
			for _, e := range p.Endpoints {
				if seen[e.State] {
					continue
				}
				seen[e.State] = true
				if sm := e.ServedModels(); sm != nil && sm.Source == fleet.ModelsPinned {
					continue // pinned in the config
				}
				st := mc.sched[e.State]
				if st == nil {
					st = &pollSched{}
					mc.sched[e.State] = st
				}
				if !all && now.Before(st.next) && !(up && !st.ok && healthy(e)) {
					continue
				}
				r := &polled{e: e, st: st}
				results = append(results, r)
				wg.Add(1)
				go func() {
					defer wg.Done()
					sem <- struct{}{}
					defer func() { <-sem }()
					r.changed, r.err = c.pollEndpoint(ctx, client, mc, d.Name, want, e)
				}()
			}
		}
	}
	wg.Wait()
	for st := range mc.sched {
		if !seen[st] {
			delete(mc.sched, st) // gone from the config or discovery
		}
	}
	now = time.Now()
	changed := false
	for _, r := range results {
		changed = changed || r.changed
		if r.err == nil {
			r.st.ok, r.st.fails, r.st.next = true, 0, now.Add(every)
			continue
		}
		r.st.ok = false
		r.st.fails++
		if healthy(r.e) {
			r.st.next = now.Add(repollAfter(r.st.fails, every))
		} else {
			r.st.next = now.Add(every) // a health check finding it up wakes the poll
		}
	}
	if changed {
		c.d.RefreshModels()
	}
	c.noteOverdue(snap, mc, now)
	next := now.Add(every)
	for _, st := range mc.sched {
		if st.next.Before(next) {
			next = st.next
		}
	}
	return next
}

// noteOverdue logs, once per endpoint, that readiness stopped waiting for
// the model list of an endpoint that is up (health.models_wait).
func (c *Checker) noteOverdue(snap *route.Snapshot, mc *modelCheck, now time.Time) {
	wait := snap.Config.Health.ModelsWaitOr()
	for _, p := range snap.Pools() {
		for _, e := range p.Endpoints {
			st := mc.sched[e.State]
			if st == nil {
				continue
			}
			switch {
			case e.ModelsKnown():
				st.overdue = false
			case !st.overdue && e.ModelsOverdue(now.UnixNano(), wait):
				st.overdue = true
				c.log.Warn().Str(fleet.FieldEndpoint, e.Name).Str("address", e.Address).Dur("waited", wait).Int("failed_polls", st.fails).
					Msgf("endpoint %s passes its health checks but its GET %s has not answered for %v (health.models_wait): readiness stops waiting for it; it gets its deployment's base models and no adapter until the list arrives (retried)", e.Name, ServedModelsPath, wait)
			}
		}
	}
}

// pollEndpoint asks one endpoint and publishes its list; it reports
// whether the list changed, and the poll's error.
func (c *Checker) pollEndpoint(ctx context.Context, client *http.Client, mc *modelCheck, dep string, want []string, e *fleet.Endpoint) (bool, error) {
	list, err := fetchServedList(ctx, client, e.Address)
	mc.mu.Lock()
	defer mc.mu.Unlock()
	if err != nil {
		mc.polls[1]++
		c.log.Debug().Err(err).Str("endpoint", e.Name).Msg("served models: no answer")
		return false, err // keep what it served: a replica restarting still serves it
	}
	mc.polls[0]++
	sort.Slice(list, func(i, j int) bool { return list[i].ID < list[j].ID })
	old := e.ServedModels()
	if old != nil && old.Source == fleet.ModelsListed && slices.Equal(old.Models, list) {
		return false, nil
	}
	e.SetServed(&fleet.ServedModels{Models: list, Source: fleet.ModelsListed})
	mc.changes++
	var served []string
	var miss []string
	for _, m := range list {
		served = append(served, m.ID)
	}
	for _, m := range want {
		if !slices.Contains(served, m) {
			miss = append(miss, m)
		}
	}
	sort.Strings(miss)
	mc.missing[e.Name] = miss
	key := e.Name + "|" + e.Address
	joined := strings.Join(served, ",")
	if mc.listed[key] == joined {
		return true, nil
	}
	mc.listed[key] = joined
	if len(miss) > 0 {
		c.log.Warn().Str("endpoint", e.Name).Str("address", e.Address).Strs("missing", miss).Strs("serves", served).
			Msgf("endpoint %s does not serve %s of deployment %s: requests for it go to the deployment's endpoints that serve it (404 when none does); if it is another name for the model this replica runs, add it to its --served-model-name; a different model belongs on replicas that serve it (its own deployment is clearest)",
				e.Name, quoteAll(miss), dep)
	} else {
		c.log.Info().Str("endpoint", e.Name).Strs("serves", served).Msg("served models")
	}
	return true, nil
}

// fetchServedModels returns the ids of GET http://addr/v1/models.
func fetchServedModels(ctx context.Context, client *http.Client, addr string) ([]string, error) {
	list, err := fetchServedList(ctx, client, addr)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(list))
	for _, m := range list {
		out = append(out, m.ID)
	}
	return out, nil
}

// fetchServedList returns the models of GET http://addr/v1/models with
// their parents (vLLM lists a LoRA adapter with "parent": its base model).
func fetchServedList(ctx context.Context, client *http.Client, addr string) ([]fleet.ServedModel, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+ServedModelsPath, nil)
	if err != nil {
		return nil, fmt.Errorf("served models: %w", err)
	}
	res, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("served models: %w", err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
		return nil, fmt.Errorf("served models: %s answered %d", addr, res.StatusCode)
	}
	var list struct {
		Data []struct {
			ID     string  `json:"id"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(res.Body, 1<<20)).Decode(&list); err != nil {
		return nil, fmt.Errorf("served models: %s: %w", addr, err)
	}
	out := make([]fleet.ServedModel, 0, len(list.Data))
	for _, m := range list.Data {
		sm := fleet.ServedModel{ID: m.ID}
		if m.Parent != nil {
			sm.Parent = *m.Parent
		}
		out = append(out, sm)
	}
	return out, nil
}

func (mc *modelCheck) writeMetrics(b *strings.Builder) {
	mc.mu.Lock()
	defer mc.mu.Unlock()
	b.WriteString("# HELP turnout_endpoint_model_missing 1 for each model name a deployment accepts that the endpoint does not serve (GET /v1/models): requests with it go to the deployment's other endpoints.\n# TYPE turnout_endpoint_model_missing gauge\n")
	for _, n := range slices.Sorted(maps.Keys(mc.missing)) {
		for _, m := range mc.missing[n] {
			fmt.Fprintf(b, "turnout_endpoint_model_missing{endpoint=%q,model=%q} 1\n", n, m)
		}
	}
	b.WriteString("# HELP turnout_served_models_polls_total GET /v1/models calls by result.\n# TYPE turnout_served_models_polls_total counter\n")
	fmt.Fprintf(b, "turnout_served_models_polls_total{result=\"ok\"} %d\nturnout_served_models_polls_total{result=\"failed\"} %d\n", mc.polls[0], mc.polls[1])
	b.WriteString("# HELP turnout_served_models_changes_total Endpoint model lists that changed (each rebuilds the model table).\n# TYPE turnout_served_models_changes_total counter\n")
	fmt.Fprintf(b, "turnout_served_models_changes_total %d\n", mc.changes)
}

func quoteAll(s []string) string {
	q := make([]string, len(s))
	for i, v := range s {
		q[i] = fmt.Sprintf("%q", v)
	}
	return strings.Join(q, ", ")
}

// A name no replica serves is refused at load. turnout forwards the request
// body unchanged: it does not rewrite "model", because that would cost the
// proxy a body copy on every request and cannot be done at all in nginx
// header mode (auth_request never sees the body). Replicas of one
// deployment may serve different names (one serves alpha, another beta):
// requests for each go to the endpoints that serve it (the model table),
// so that is not refused. What is refused is a name in a deployment's
// models: that none of its answering replicas serves although they serve
// another of its names: every request for it would get 404.
// VerifyServedModels asks every static endpoint that answers (GET
// /v1/models). A replica that does not answer in time cannot be checked
// here; the served-model poll (above) warns about it later, as it
// does for discovered endpoints, which are not known at load.
//
// A replica serving none of the deployment's names is either the wrong
// replica or a permissive server (the mock without --strict-models accepts
// every name); the background check warns about it instead of refusing the
// config.

// ServedModelsTimeout bounds the whole load-time check: a config load never
// waits longer than this on replicas.
const ServedModelsTimeout = 2 * time.Second

// VerifyServedModels returns a *ConfigError naming every deployments[i].models[j]
// that no answering static endpoint of the deployment serves although they
// serve another of its names; nil when there is none or nobody answered.
func VerifyServedModels(ctx context.Context, cfg *config.Config, client *http.Client) error {
	ctx, cancel := context.WithTimeout(ctx, ServedModelsTimeout)
	defer cancel()
	if client == nil {
		client = &http.Client{Timeout: ServedModelsTimeout}
	}
	type target struct{ dep, pool, ep int }
	byAddr := map[string][]target{}
	var addrs []string
	for i := range cfg.Deployments {
		for j := range cfg.Deployments[i].Pools {
			for k, e := range cfg.Deployments[i].Pools[j].Endpoints {
				if _, ok := byAddr[e.Address]; !ok {
					addrs = append(addrs, e.Address)
				}
				byAddr[e.Address] = append(byAddr[e.Address], target{i, j, k})
			}
		}
	}
	served := make([][]string, len(addrs)) // nil: no answer
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for n, addr := range addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			if list, err := fetchServedModels(ctx, client, addr); err == nil {
				served[n] = list
			}
		}()
	}
	wg.Wait()

	// One problem per name that no answering replica of its deployment
	// serves, naming the replicas that lack it.
	type key struct{ dep, model int }
	missing := map[key][]string{}
	servedBy := map[key]bool{}
	var order []key
	example := map[key][]string{} // what one of those replicas serves
	for n, addr := range addrs {
		list := served[n]
		if list == nil {
			continue
		}
		for _, t := range byAddr[addr] {
			d := &cfg.Deployments[t.dep]
			if !slices.ContainsFunc(d.Models, func(m string) bool { return slices.Contains(list, m) }) {
				continue // serves none: warned about in the background
			}
			for m, name := range d.Models {
				k := key{t.dep, m}
				if slices.Contains(list, name) {
					servedBy[k] = true
					continue
				}
				if _, ok := missing[k]; !ok {
					order = append(order, k)
					example[k] = list
				}
				missing[k] = append(missing[k], d.Pools[t.pool].Endpoints[t.ep].Name+" ("+addr+")")
			}
		}
	}
	var problems []*config.FieldError
	for _, k := range order {
		if servedBy[k] {
			continue // routed to the replicas that serve it
		}
		d := &cfg.Deployments[k.dep]
		name := d.Models[k.model]
		path := fmt.Sprintf("deployments[%d].models[%d]", k.dep, k.model)
		problems = append(problems, &config.FieldError{Path: path, Line: cfg.Line(path), Msg: fmt.Sprintf(
			"%q is not served by any replica of deployment %s (%s serve%s %s): turnout forwards the body unchanged (it does not rewrite \"model\"), so every request for %q would get 404; "+
				"if %q is a different model, give it its own deployment with replicas that serve it; if it is another name for the model these replicas run, add it to their --served-model-name; or remove %q from models",
			name, d.Name, strings.Join(missing[k], ", "), plural(len(missing[k])), quoteAll(example[k]), name, name, name)})
	}
	if len(problems) == 0 {
		return nil
	}
	sort.SliceStable(problems, func(i, j int) bool { return problems[i].Line < problems[j].Line })
	return &config.ConfigError{Problems: problems}
}

// plural is the verb ending for n subjects ("serves" for one).
func plural(n int) string {
	if n == 1 {
		return "s"
	}
	return ""
}
