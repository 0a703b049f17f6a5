package route

import (
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/fleet"
	"github.com/turnout/turnout/route/flow"
	"github.com/turnout/turnout/route/models"
	"github.com/turnout/turnout/route/payload"
	"github.com/turnout/turnout/route/policy"
)

// Decide is the one decision entry point: it routes in and fills v.
func (d *Decider) Decide(in *contract.Input, v *contract.Verdict) {
	snap := d.snap.Load()
	t := d.txns.get(d, snap.maxBlocks)
	start := time.Now()
	t.decideInput(snap, in, v, start)
	t.dropAbandoned(in, v, start)
	t.noteRefusal(v, start, in.Repeat)
	if tr, ok := d.dec.tracer.get(); ok {
		t.traceDecision(tr, in, v, start)
	}
	d.txns.put(t)
}

// decideInput runs the stages of doc.go after the read: deployment, pick,
// verdict. start is when the request reached turnout. The stages are
// methods of the request's Txn, which holds the Decider they answer to.
func (t *Txn) decideInput(snap *Snapshot, in *contract.Input, v *contract.Verdict, start time.Time) {
	v.Reset()
	cfg := snap.Config
	r := &t.req
	*r = fleet.Request{Truncated: in.Truncated}
	t.dsnap, t.dep, t.model, t.refusedPool, t.only, t.held, t.prefillTime = snap, nil, -1, nil, nil, 0, 0
	t.method, t.uri, t.rid = in.Method, in.URI, nil
	body := in.Body
	if len(body) > cfg.MaxBody {
		body, r.Truncated = body[:cfg.MaxBody], true
	}
	var modelHdr []byte
	t.flowIn = flow.Inputs{}
	for i := range in.Headers {
		h := &in.Headers[i]
		if len(h.Value) == 0 {
			continue
		}
		role := hdrRole(h.Role)
		if role == 0 {
			role = snap.headerRole(h.Name)
		}
		if role&hdrSession != 0 {
			r.Session = h.Value
		}
		if role&hdrModel != 0 {
			modelHdr = h.Value
		}
		switch {
		case role&hdrPriority != 0:
			t.flowIn.Priority = h.Value
		case role&hdrTenant != 0:
			t.flowIn.Tenant = h.Value
		case role&hdrAuthz != 0:
			t.flowIn.Authorization = h.Value
		case role&hdrSLO != 0:
			t.flowIn.SLO = h.Value
		}
		if role&hdrRequestID != 0 {
			t.rid = h.Value
		}
	}

	// The one pass over the body (route/payload): later stages read the index.
	t.idx.Reset() // a new request: its scan count starts at zero
	t.idx.Build(body, r.Truncated)
	r.Payload = &t.idx
	model := t.idx.Model()
	if len(model) == 0 {
		model = modelHdr
	}
	r.Model = model
	var dep *Deployment
	switch {
	case len(model) > 0:
		tbl := snap.models.Load()
		me := tbl.Lookup(model)
		if len(snap.Deployments) == 1 && (me == nil || me.Refuse != models.RefuseNone || me.Adapter ||
			tbl.HasAdapters() || snap.Deployments[0].Config.LoRA.LoadOnDemand) {
			// One deployment: where a name may pick the endpoints (an
			// adapter, one it may load, or a name it would refuse, first
			// or last), read it as vLLM does, the last "model" key; with
			// no adapter a base model's first key spares the sweep.
			// Several deployments refuse two keys.
			if last := t.idx.LastModel(t.lastModel[:]); last != nil && string(last) != string(model) {
				model, r.Model = last, last
				me = tbl.Lookup(model)
			}
		}
		if me == nil || me.Refuse != models.RefuseNone || (me.Adapter && !servedAvailable(snap, me)) {
			if ld := t.loadOnDemand(snap, model, me); ld != nil {
				me = ld // lora.load_on_demand loaded it (loadOnDemand, route/models/load.go)
			}
		}
		if me == nil || me.Refuse == models.RefuseUnknown {
			di := int32(-1)
			if me != nil {
				me.Stats.Refused.Add(1)
				di = me.Dep
			}
			if pend := snap.listsPending(di); pend != nil {
				t.refuseListsPending(v, pend, model) // it may be an adapter of a list not read yet
				return
			}
			v.Refuse(404, "invalid_request_error", "model_not_found",
				"The model `"+string(cut(model, maxEchoModel))+"` does not exist.")
			return
		}
		dep, t.model, t.only = snap.Deployments[me.Dep], me.Idx, me
		if me.Adapter {
			r.Adapter, r.AdapterHash = true, fleet.HashKey(model)
		}
		if me.Refuse == models.RefuseGone {
			me.Stats.Refused.Add(1)
			t.refuseModel(v, dep, model)
			return
		}
	case len(snap.Deployments) == 1:
		dep = snap.Deployments[0]
	default:
		v.Refuse(400, "invalid_request_error", "model_required",
			"a \"model\" is required: several deployments are served")
		return
	}
	t.dep = dep
	if len(r.Session) > 0 {
		r.HasSession = true
		r.SessionHash = fleet.HashKey(r.Session)
	}
	if dep.flow != nil {
		t.runHeld(snap, dep, in, v, start)
		return
	}
	t.runPasses(snap, dep, in, v, start)
	if me := t.only; me != nil {
		if v.Status == 200 {
			me.Stats.Decisions.Add(1)
		} else if v.Reason == contract.ReasonModelUnavailable {
			me.Stats.Refused.Add(1)
		}
	}
}

// loadOnDemand loads an adapter no endpoint serves on the endpoint the
// deployment's policy picks, when the deployment has lora.load_on_demand
// and claims the name (route/models/load.go), and returns the model entry
// after the load; nil when it does not apply or the load failed (the
// caller refuses as before). It blocks this request for at most
// lora.load_timeout; every load is counted and logged.
func (t *Txn) loadOnDemand(snap *Snapshot, model []byte, me *models.Entry) *models.Entry {
	var dep *Deployment
	name := string(model)
	if me != nil {
		dep = snap.Deployments[me.Dep]
		if !models.Loadable(dep.Config, name) {
			return nil // only the names it claims for loading: their lora_path is known
		}
	} else {
		for _, cand := range snap.Deployments {
			if models.Loadable(cand.Config, name) {
				dep = cand
				break
			}
		}
	}
	if dep == nil || dep.Serve == nil {
		return nil
	}
	dc := dep.Config
	r := &t.req
	r.Only, r.Adapter, r.AdapterHash = nil, true, fleet.HashKey(model)
	c := &t.choices[0]
	*c = fleet.Choice{Endpoints: t.picks[0:0:1], Work: c.Work}
	dep.Serve.Policy.Pick(r, dep.Serve, c)
	if len(c.Endpoints) == 0 {
		return nil
	}
	if !t.d.loader.LoadOn(t.d.ctx, t.d.log, t.d.mstats, dep.Name, dc, c.Endpoints[0], name) {
		return nil
	}
	t.d.RefreshModels()
	*c = fleet.Choice{Work: c.Work}
	return t.d.snap.Load().models.Load().Lookup(model)
}

// runHeld is runPasses behind flow control (route/flow): while the
// serving pool is saturated the request waits for its turn, by class and
// tenant, and is then routed by the policy as the pool is at release
// time; a sheddable one past its budget is refused with 429.
func (t *Txn) runHeld(snap *Snapshot, dep *Deployment, in *contract.Input, v *contract.Verdict, start time.Time) {
	fr := &t.fr
	dep.flow.Classify(fr, t.req.Model, &t.flowIn)
	fr.Bytes = heldBytes(in)
	switch o := dep.flow.Admit(fr, in.Watch); o {
	case flow.Shed:
		v.RetryAfter = true
		v.Refuse(429, "rate_limit_exceeded", contract.ReasonFlowShed,
			"deployment "+dep.Name+" is saturated and this request's class ("+dep.flow.Config().Classes[fr.Class].Name+") is shed past its queue budget; retry later")
		return
	case flow.Gone:
		v.Refuse(503, "service_unavailable", contract.ReasonFlowGone, "the client went away while its request was held")
		return
	case flow.Released, flow.TimedOut:
		held := start
		start = time.Now() // the decision starts at release: its latency is the pick's
		t.held = start.Sub(held)
	}
	// Deferred: a panicking pick (recovered by the transport) must give
	// its reserved room back.
	defer dep.flow.Done()
	t.req.TTFTObjectiveMs = fr.ObjectiveLeft(t.held)
	t.runPasses(snap, dep, in, v, start)
}

// heldBytes is what holding in keeps: the transport's copy of its body
// and headers (an SPOE frame, an HTTP call's buffers), and the scratch.
func heldBytes(in *contract.Input) int64 {
	n := len(in.Body) + len(in.URI) + heldOverhead
	for i := range in.Headers {
		n += len(in.Headers[i].Name) + len(in.Headers[i].Value)
	}
	return int64(n)
}

// heldOverhead is a held request's own memory besides its bytes: its
// goroutine's stack, its waiter, its Txn's share.
const heldOverhead = 8 << 10

// bindFlow gives the snapshot's deployments with flow_control their
// controllers (kept across reloads while their config is unchanged) and
// their serving pools the completion hook that releases held requests.
func bindFlow(flows *flow.Set, snap *Snapshot) {
	live := map[string]bool{}
	flows.SetMaxBytes(int64(snap.Config.Limits.MaxBufferedBytes))
	for _, dep := range snap.Deployments {
		if dep.Config.FlowControl == nil {
			continue
		}
		live[dep.Name] = true
		dep.flow = flows.Bind(dep.Name, dep.Config.FlowControl, dep.Serve)
		dep.Serve.OnFree = dep.flow.Kick
	}
	flows.Keep(live)
}

// A Pass is one pick of a decision: a pool, whose policy runs, and what
// the pick is for. A mixed deployment runs one pass (PassServe); a
// prefill/decode deployment runs two with the same pick, as llm-d's P/D
// profile handler runs its decode then prefill profiles: the decode pool's,
// then the prefill pool's, which is skipped when the decode replica already
// holds the prompt. The passes' picks become one verdict (finish). (A
// profile, in turnout, is what a policy runs inside one pass: route/policy.)
type Pass struct {
	Pool *fleet.Pool
	Role PassRole
}

// PassRole is what a pass's pick is for.
type PassRole uint8

// Pass roles.
const (
	// PassServe picks the replica the proxy sends the request to
	// (and its fallbacks); without one the request is refused.
	PassServe PassRole = iota
	// PassPrefill picks the replica turnout runs the prefill on
	// (pd.go); it needs the whole body as a JSON object.
	PassPrefill
)

// runPasses admits the request (the prefill pass needs the whole body,
// pd.go), runs each pass's pick into its own part of the scratch, and
// turns the picks into the verdict.
func (t *Txn) runPasses(snap *Snapshot, dep *Deployment, in *contract.Input, v *contract.Verdict, start time.Time) {
	if dep.Prefill != nil && !t.admitPD(snap, &t.req, v) {
		return // the prefill pass needs what this request lacks
	}
	n := dep.pickN
	for i := range dep.Passes {
		pr := &dep.Passes[i]
		c := &t.choices[i]
		if pr.Role == PassPrefill && t.skipPrefill(dep, &t.req, &t.choices[0]) {
			*c = fleet.Choice{Reject: rejectSkipped, Work: c.Work}
			continue
		}
		if t.only != nil {
			t.req.Only = t.only.Only[i]
		}
		if in.Subset != nil && !subsetOnly(snap, pr, in, t, v) {
			return
		}
		t.pick(snap, pr.Pool, c, t.picks[i*n:i*n:(i+1)*n])
		if t.req.Adapter && i == 0 && len(c.Endpoints) > 0 {
			e := c.Endpoints[0]
			if l := e.LoRA(); l != nil && !l.Hot(t.req.Model) {
				t.only.Stats.Cold.Add(1)
			}
			if dep.Config.LoRA.MaxLoaded > 0 {
				t.d.loader.Touch(e.Address, t.req.Model) // the unload order of load_on_demand
			}
		}
		if len(c.Endpoints) == 0 && pr.Role == PassServe {
			t.refusedPool = pr.Pool
			if t.only != nil && t.only.Only[i] != nil && c.Reject == fleet.RejectNone {
				t.refuseModel(v, dep, t.req.Model)
				return
			}
			t.refuse(v, pr.Pool, c.Reject)
			return
		}
	}
	if dep.Prefill == nil {
		// After the pick: its read of the body is reused.
		if len(snap.Deployments) > 1 && refuseDuplicateModel(v, &t.idx) {
			return
		}
		if dep.flow != nil && dep.flow.ShedForSLO(&t.fr, t.req.TTFTObjectiveMs, t.choices[0].Predicted.TTFTMs) {
			// No replica is predicted to meet its objective: rather than
			// queueing in an engine, the client is told to retry.
			v.RetryAfter = true
			v.Refuse(429, "rate_limit_exceeded", contract.ReasonSLOShed,
				"deployment "+dep.Name+": no replica is predicted to give this request's first token within its objective (class "+
					dep.flow.Config().Classes[t.fr.Class].Name+", which sheds); retry later")
			return
		}
		t.route(v, dep.Serve, &t.choices[0], start)
		return
	}
	t.finishPD(snap, dep, in, v, start)
}

// subsetOnly narrows the serving pass's candidates (sc.req.Only, the
// model's endpoints or every one) to the hinted addresses before the
// policy picks; other passes (the prefill pool) keep their own. False
// with the 503 in v when no endpoint of the pool is in the hint: the
// request may go nowhere else.
func subsetOnly(snap *Snapshot, pr *Pass, in *contract.Input, sc *Txn, v *contract.Verdict) bool {
	if pr.Role != PassServe {
		if sc.only == nil {
			sc.req.Only = nil
		}
		return true
	}
	p := pr.Pool
	base := sc.req.Only
	n := (len(p.Endpoints) + 63) / 64
	m := sc.subset[:0]
	for range max(n, 1) {
		m = append(m, 0)
	}
	sc.subset = m
	found := false
	for _, a := range in.Subset.Addrs {
		if e := snap.byAddr[string(a)]; e != nil && e.Index < len(p.Endpoints) && p.Endpoints[e.Index] == e {
			if base.Has(e.Index) {
				m.Set(e.Index)
				found = true
			}
			continue
		}
		// An address shared by several pools maps to the first one's endpoint.
		for _, e := range p.Endpoints {
			if e.Address == string(a) && base.Has(e.Index) {
				m.Set(e.Index)
				found = true
			}
		}
	}
	if !found {
		v.RetryAfter = true
		v.Refuse(503, "service_unavailable", contract.ReasonSubsetEmpty,
			"none of the gateway's subset endpoints serves this request in pool "+p.Name)
		return false
	}
	sc.req.Only = m
	return true
}

// rejectSkipped marks a pass's choice as not run (a prefill the decode
// replica makes unnecessary); no policy sets it.
const rejectSkipped fleet.RejectReason = 255

// refuseDuplicateModel refuses a body with two "model" keys: Python's json
// (vLLM) keeps the last, turnout routes on the first, so the pool and the
// served model could differ (route/payload/modelkey.go). Only asked with
// several deployments: with one, every model name goes to the same
// replicas, which answer the body as vLLM reads it, and a model-only
// decision is spared the sweep of the rest of the body.
func refuseDuplicateModel(v *contract.Verdict, idx *payload.Index) bool {
	if !idx.DuplicateModel() {
		return false
	}
	v.Refuse(400, "invalid_request_error", contract.ReasonDuplicateModel,
		"the request body has more than one \"model\" key; send exactly one")
	return true
}

// pick hashes the prompt when the pool's policy wants it and runs the
// policy into c, whose Endpoints start as dst (len 0, cap = how many).
func (t *Txn) pick(snap *Snapshot, p *fleet.Pool, c *fleet.Choice, dst []*fleet.Endpoint) {
	r := &t.req
	r.Blocks, r.PromptBytes = nil, 0
	*c = fleet.Choice{Endpoints: dst, Work: c.Work}
	if p.BlockBytes > 0 {
		// Routing reads the prompt's first route_body bytes, however much
		// of the body a glue sent (the whole of it when a second "model"
		// key may lie past the cut, or for prefill/decode): the same
		// prefix and cost as a cut body.
		blocks := t.blocks
		if n := snap.Config.RouteBody / p.BlockBytes; n > 0 && n < cap(blocks) {
			blocks = blocks[:0:n]
		}
		t.hasher.ResetFor(r, p.BlockBytes, blocks)
		r.Payload.Prompt(&t.hasher)
		r.Blocks = t.hasher.Out
		r.PromptBytes = t.hasher.Total
		p.Metrics.TotalBlocks.Add(uint64(len(r.Blocks)))
		if len(r.Blocks) == 0 && r.PromptBytes > 0 {
			p.Metrics.ShortPrompts.Add(1)
		}
	}
	p.Policy.Pick(r, p, c)
	if len(c.Endpoints) == 0 {
		p.Metrics.Outcomes[fleet.OutcomeNoEndpoint].Add(1)
		return
	}
	p.Metrics.Outcomes[c.Outcome].Add(1)
	p.Metrics.MatchedBlocks.Add(uint64(c.Matched))
	t.sharePrefix(p, c.Endpoints[0], r.Blocks)
}

// sharePrefix hands a decision of a pool that records prefixes to the
// sink, if any, with or without blocks: peers count every decision in the
// requests an endpoint served (Endpoint.Served, the bounded-load guard),
// and a prompt shorter than one block is one of them.
func (t *Txn) sharePrefix(p *fleet.Pool, e *fleet.Endpoint, blocks []uint64) {
	if !p.Records {
		return
	}
	if s, ok := t.d.sink.get(); ok {
		s.RoutedPrefix(p, e, blocks)
	}
}

// route opens the decision for the policy's first pick and fills v with it.
func (t *Txn) route(v *contract.Verdict, p *fleet.Pool, c *fleet.Choice, start time.Time) {
	picks := c.Endpoints
	e := picks[0]
	v.Status = 200
	m := decisionMeta{pool: p, names: t.dsnap.models.Load(), model: t.model, matched: int32(min(c.Matched, 1<<31-1)), outcome: c.Outcome, session: t.req.HasSession, pred: c.Predicted, notes: c.Notes, slo: t.dep.flow.Ticket(&t.fr),
		method: t.method, uri: t.uri, rid: t.rid}
	v.Decision = t.d.dec.open(e, start.UnixNano(), &m)
	v.Server, v.Addr, v.Pool = e.NameHdr, e.AddrHdr, p.NameHdr
	v.Fallbacks = v.FallbackRoom()
	for _, f := range picks[1:] {
		v.Fallbacks = append(v.Fallbacks, f.NameHdr)
	}
	if len(picks) > 1 {
		v.FallbackAddr = picks[1].AddrHdr
	}
	// One decision in latencySample is timed: a clock read costs about as
	// much as a round-robin pick on some VMs, and ids are random, so the
	// sample is unbiased.
	if v.Decision%latencySample == 0 {
		p.Metrics.Latency.Observe(time.Since(start))
	}
}

// maxPicks bounds the endpoints one decision picks, over all its passes.
const maxPicks = 16

// latencySample: the decision latency histogram times one decision in this many.
const latencySample = 8

// refuse answers a request no endpoint was picked for.
func (t *Txn) refuse(v *contract.Verdict, p *fleet.Pool, why fleet.RejectReason) {
	switch why {
	case fleet.RejectBadBody:
		v.Refuse(400, "invalid_request_error", "token_ids_required",
			"pool "+p.Name+" routes on token ids (strict): send a prompt the tokenizer can read or token ids")
	case fleet.RejectUnavailable:
		v.RetryAfter = true
		v.Refuse(503, "service_unavailable", "tokenizer_unavailable",
			"pool "+p.Name+" routes on token ids (strict) and the tokenizer is unavailable")
	default:
		v.RetryAfter = true
		v.Refuse(503, "service_unavailable", contract.ReasonNoEndpoint, "no available endpoint in pool "+p.Name)
	}
}

// servedAvailable reports whether an available endpoint of the serving
// pool lists the adapter me (a mixed deployment's one pass). Where none
// does (its holders down, draining or stalled), lora.load_on_demand may
// load it elsewhere rather than answer 503 until one is back.
func servedAvailable(snap *Snapshot, me *models.Entry) bool {
	dep := snap.Deployments[me.Dep]
	if dep.Prefill != nil || dep.Serve == nil || me.Only[0] == nil {
		return true
	}
	for _, e := range dep.Serve.Endpoints {
		if me.Only[0].Has(e.Index) && e.Available() {
			return true
		}
	}
	return false
}

// refuseModel refuses a model whose endpoints all are down, or that the
// endpoints that served it no longer list: 503, so that clients retry
// (Retry-After), rather than a 404 that says it never existed.
func (t *Txn) refuseModel(v *contract.Verdict, dep *Deployment, model []byte) {
	v.RetryAfter = true
	v.Refuse(503, "service_unavailable", contract.ReasonModelUnavailable,
		"no available endpoint of deployment "+dep.Name+" serves the model `"+string(cut(model, maxEchoModel))+"` now")
}

// maxEchoModel bounds the model name echoed in a 404: longer names are
// never served (Validate), and the answer must stay under MaxAnswerBody.
const maxEchoModel = 256

// cut shortens b to n bytes, marking the cut.
func cut(b []byte, n int) []byte {
	if len(b) <= n {
		return b
	}
	return append(b[:n:n], "..."...)
}

// Txn is one request's working memory, pooled so decisions do not
// allocate. A transport that reads the proxy's call itself (route/httpapi)
// takes one with Begin, fills its Input (ProxyHeaders, Input), decides
// (Decide) and gives it back with End; Decider.Decide does all of it for
// an Input read elsewhere (route/spoe).
type Txn struct {
	// d is the Decider whose pool the Txn belongs to: the pipeline's
	// stages (the Txn's methods) count, log and open decisions there.
	d      *Decider
	in     contract.Input
	v      contract.Verdict
	req    fleet.Request
	hasher fleet.PrefixHasher
	blocks []uint64
	picks  [maxPicks]*fleet.Endpoint
	// idx is the request body, indexed once (route/payload).
	idx payload.Index
	// lastModel holds an escaped last "model" key's name (LastModel).
	lastModel [256]byte
	// flowIn are the flow headers' values, found in decideInput's one
	// pass over the headers (route/flow reads them); fr is what flow
	// control made of them (runHeld; valid only with the deployment's flow).
	flowIn flow.Inputs
	fr     flow.Request
	// Buf is the transport's own memory, kept here so a request takes one
	// pooled object.
	Buf TxnBuffers
	// snap and start are the snapshot and the arrival time of a Begin.
	snap  *Snapshot
	start time.Time

	// choices are the passes' picks (Deployment.Passes: the serving
	// pool's, then the prefill pool's); their Endpoints are views into picks.
	choices [2]fleet.Choice
	// pdh is the prefill call's header source (pd.go).
	pdh pdHeaders
	// names remembers what the request header names are (headers.go).
	names nameMemo
	// What the ledger and the request log keep of the decision
	// (decisions.go): the snapshot deciding, the deployment, the model as an
	// index into the snapshot's model names, the pool that had no endpoint.
	dsnap *Snapshot
	dep   *Deployment
	// only is the request's model's entry (nil: no model, or the one deployment).
	only *models.Entry
	// subset is the serving pool's endpoints a gateway's hint allows (subsetOnly).
	subset      fleet.Mask
	model       int32
	refusedPool *fleet.Pool
	// The request's method, URI and request id: views into the Input,
	// for the ledger and the request log.
	method, uri, rid []byte
	// held is how long flow control held the request, prefillTime how
	// long the prefill call took; span is the record a Tracer reads
	// (tracing.go).
	held, prefillTime time.Duration
	span              DecisionSpan
}

// TxnBuffers are a transport's buffers: Body holds a streamed request
// body, Drop reads the part beyond max_body, Out builds answer values.
type TxnBuffers struct {
	Body []byte
	Drop [4096]byte
	Out  []byte
}

// Begin starts a request on the live snapshot: its Input is empty, its
// clock started.
func (d *Decider) Begin() *Txn {
	snap := d.snap.Load()
	t := d.txns.get(d, snap.maxBlocks)
	t.snap, t.start = snap, time.Now()
	t.in.Reset()
	return t
}

// End gives a Txn back; nothing of it may be used after.
func (d *Decider) End(t *Txn) {
	t.snap = nil
	d.txns.put(t)
}

// Config is the config of the Txn's snapshot (the limits a transport reads by).
func (t *Txn) Config() *config.Config { return t.snap.Config }

// Input is what the transport fills.
func (t *Txn) Input() *contract.Input { return &t.in }

// Picks are the endpoints of a routed decision, best first: the Verdict's
// Server, then its Fallbacks (nil when refused; valid until End).
func (t *Txn) Picks() []*fleet.Endpoint {
	if t.v.Status != 200 {
		return nil
	}
	return t.choices[0].Endpoints
}

// ProxyHeaders takes the request headers of the proxy's call: the
// body-cut flag, the original URI and method, the asked fields, and the forwarded headers
// (matched once per name and snapshot, headers.go); other headers are
// ignored. One call for all of them: a call per header cost a few percent
// of a round-robin decision.
func (t *Txn) ProxyHeaders(h *fasthttp.RequestHeader) {
	for k, v := range h.All() {
		if len(v) == 0 {
			continue
		}
		in := &t.in
		switch kind, role := t.names.classify(t.snap, k); kind {
		case kindTruncated:
			in.Truncated = true
		case kindOrigURI:
			in.URI = v
		case kindOrigMethod:
			in.Method = v
		case kindRepeat:
			in.Repeat = true
		case kindWant:
			in.Want = v
		case kindForwarded:
			in.AddHeaderRole(k, v, uint8(role))
		}
	}
}

// DecideTxn decides the Txn's Input on its snapshot and returns the Verdict
// (valid until End).
func (d *Decider) DecideTxn(t *Txn) *contract.Verdict {
	t.decideInput(t.snap, &t.in, &t.v, t.start)
	t.dropAbandoned(&t.in, &t.v, t.start)
	t.noteRefusal(&t.v, t.start, t.in.Repeat)
	if tr, ok := d.dec.tracer.get(); ok {
		t.traceDecision(tr, &t.in, &t.v, t.start)
	}
	return &t.v
}

// noteRefusal counts and logs a refusal once: not again when the call
// repeats one to fetch its body (Input.Repeat).
func (t *Txn) noteRefusal(v *contract.Verdict, start time.Time, repeat bool) {
	if v.Status == 200 || repeat {
		return
	}
	t.d.ref.noteVerdict(v)
	t.d.dec.logRefusal(t, v, start)
}

// txnPool keeps Txns between requests, so that a decision allocates
// nothing once the pool is warm.
type txnPool struct {
	pool sync.Pool
	// observe, when set (tests), sees each request's Request as the
	// transport returns it: the proof that the body is scanned once.
	observe func(*fleet.Request)
}

// get takes a Txn for a decision of d whose prompts hash into at most
// maxBlocks blocks.
func (p *txnPool) get(d *Decider, maxBlocks int) *Txn {
	t, _ := p.pool.Get().(*Txn)
	if t == nil {
		t = &Txn{d: d, Buf: TxnBuffers{Out: make([]byte, 0, 512)}}
		for i := range t.choices {
			t.choices[i].Work = policy.NewWork()
		}
	}
	if cap(t.blocks) < maxBlocks {
		t.blocks = make([]uint64, 0, maxBlocks)
	}
	return t
}

// put returns a request's Txn to the pool, after the test hook (observe)
// saw the request.
func (p *txnPool) put(t *Txn) {
	if p.observe != nil {
		p.observe(&t.req)
	}
	t.Buf.trim()
	p.pool.Put(t)
}

// keepBodyCap is the largest body buffer a pooled Txn keeps: the default
// max_body (256 KiB) and below stay pooled (a burst reuses them instead of
// allocating ~2x each body as garbage, which runs RSS to 8-15x idle in a
// 3,000-connection burst; route/httpapi returns the pool's
// memory after a burst). A larger max_body's buffers are not kept: a
// pooled buffer is counted against limits.max_buffered_bytes only while
// its request runs.
const keepBodyCap = 256 << 10

// trim drops buffers too large to keep in the pool.
func (b *TxnBuffers) trim() {
	if cap(b.Body) > keepBodyCap {
		b.Body = nil
	}
}
