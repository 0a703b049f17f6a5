package route

import (
	"time"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"
	"github.com/turnout/turnout/route/payload"
)

// Decide is the one decision entry point: it routes in and fills v.
func (s *Decider) Decide(in *Input, v *Verdict) {
	snap := s.snap.Load()
	sc := s.getScratch(snap.maxBlocks)
	start := time.Now()
	s.decideInput(snap, in, v, sc, start)
	if v.Status != 200 {
		s.logRefusal(sc, v, start)
	}
	s.release(sc)
}

// decideInput runs the stages of doc.go after the read: deployment, pick,
// verdict. start is when the request reached turnout.
func (s *Decider) decideInput(snap *Snapshot, in *Input, v *Verdict, sc *Txn, start time.Time) {
	v.reset()
	cfg := snap.Config
	r := &sc.req
	*r = fleet.Request{Truncated: in.Truncated}
	sc.dsnap, sc.dep, sc.model, sc.refusedPool = snap, nil, -1, nil
	body := in.Body
	if len(body) > cfg.MaxBody {
		body, r.Truncated = body[:cfg.MaxBody], true
	}
	var modelHdr []byte
	for i := range in.Headers {
		h := &in.Headers[i]
		if len(h.Value) == 0 {
			continue
		}
		role := h.role
		if role == 0 {
			role = snap.headerRole(h.Name)
		}
		if role&hdrSession != 0 {
			r.Session = h.Value
		}
		if role&hdrModel != 0 {
			modelHdr = h.Value
		}
	}

	// The one pass over the body (route/payload): later stages read the index.
	sc.idx.Reset() // a new request: its scan count starts at zero
	sc.idx.Build(body, r.Truncated)
	r.Payload = &sc.idx
	model := sc.idx.Model()
	if len(model) == 0 {
		model = modelHdr
	}
	r.Model = model
	var d *Deployment
	switch {
	case len(model) > 0:
		ref := snap.byModel[string(model)]
		d, sc.model = ref.d, ref.idx
		if d == nil {
			s.m.errors[errUnknownModel].Add(1)
			v.refuse(404, "invalid_request_error", "model_not_found",
				"The model `"+string(cut(model, maxEchoModel))+"` does not exist.")
			return
		}
	case len(snap.Deployments) == 1:
		d = snap.Deployments[0]
	default:
		s.m.errors[errNoModel].Add(1)
		v.refuse(400, "invalid_request_error", "model_required",
			"a \"model\" is required: several deployments are served")
		return
	}
	sc.dep = d
	if len(r.Session) > 0 {
		r.HasSession = true
		r.SessionHash = fleet.HashKey(r.Session)
	}
	if d.Prefill != nil {
		s.routePD(snap, d, in, v, sc, start)
		return
	}
	s.decide(snap, d.Serve, v, sc, start)
}

// decide runs the pool's policy and fills the verdict.
func (s *Decider) decide(snap *Snapshot, p *fleet.Pool, v *Verdict, sc *Txn, start time.Time) *fleet.Endpoint {
	c := &sc.serve
	s.pick(snap, p, sc, c, sc.picks[:0:min(1+snap.Config.Fallbacks, len(sc.picks))])
	if len(c.Endpoints) == 0 {
		sc.refusedPool = p
		s.refuse(v, p, c.Reject)
		return nil
	}
	s.route(v, p, c, sc, start)
	return c.Endpoints[0]
}

// pick hashes the prompt when the pool's policy wants it and runs the
// policy into c, whose Endpoints start as dst (len 0, cap = how many).
func (s *Decider) pick(snap *Snapshot, p *fleet.Pool, sc *Txn, c *fleet.Choice, dst []*fleet.Endpoint) {
	r := &sc.req
	r.Blocks, r.PromptBytes = nil, 0
	*c = fleet.Choice{Endpoints: dst}
	if p.BlockBytes > 0 {
		sc.hasher.Reset(p.BlockBytes, sc.blocks)
		r.Payload.Prompt(&sc.hasher)
		r.Blocks = sc.hasher.Out
		r.PromptBytes = sc.hasher.Total
		p.Metrics.TotalBlocks.Add(uint64(len(r.Blocks)))
	}
	p.Policy.Pick(r, p, c)
	if len(c.Endpoints) == 0 {
		p.Metrics.Outcomes[fleet.OutcomeNoEndpoint].Add(1)
		return
	}
	p.Metrics.Outcomes[c.Outcome].Add(1)
	p.Metrics.MatchedBlocks.Add(uint64(c.Matched))
	s.sharePrefix(p, c.Endpoints[0], r.Blocks)
}

// sharePrefix hands a decision to the sink, if any.
func (s *Decider) sharePrefix(p *fleet.Pool, e *fleet.Endpoint, blocks []uint64) {
	if len(blocks) == 0 || !p.Records {
		return
	}
	if b := s.sink.Load(); b != nil {
		b.RoutedPrefix(p, e, blocks)
	}
}

// route opens the decision for the policy's first pick and fills v with it.
func (s *Decider) route(v *Verdict, p *fleet.Pool, c *fleet.Choice, sc *Txn, start time.Time) {
	picks := c.Endpoints
	e := picks[0]
	v.Status = 200
	m := decisionMeta{pool: p, snap: sc.dsnap, model: sc.model, matched: int32(min(c.Matched, 1<<31-1)), outcome: c.Outcome, session: sc.req.HasSession}
	v.Decision = s.dec.open(e, start.UnixNano(), &m)
	v.Server, v.Addr, v.Pool = e.NameHdr, e.AddrHdr, p.NameHdr
	v.Fallbacks = v.fb[:0]
	for _, f := range picks[1:] {
		v.Fallbacks = append(v.Fallbacks, f.NameHdr)
	}
	// One decision in latencySample is timed: a clock read costs about as
	// much as a round-robin pick on some VMs, and ids are random, so the
	// sample is unbiased.
	if v.Decision%latencySample == 0 {
		p.Metrics.Latency.Observe(time.Since(start))
	}
}

// latencySample: the decision latency histogram times one decision in this many.
const latencySample = 8

// refuse answers a request no endpoint was picked for.
func (s *Decider) refuse(v *Verdict, p *fleet.Pool, why fleet.RejectReason) {
	switch why {
	case fleet.RejectBadBody:
		s.m.errors[errBadBody].Add(1)
		v.refuse(400, "invalid_request_error", "token_ids_required",
			"pool "+p.Name+" routes on token ids (strict): send a prompt the tokenizer can read or token ids")
	case fleet.RejectUnavailable:
		v.RetryAfter = true
		v.refuse(503, "service_unavailable", "tokenizer_unavailable",
			"pool "+p.Name+" routes on token ids (strict) and the tokenizer is unavailable")
	default:
		v.RetryAfter = true
		v.refuse(503, "service_unavailable", ReasonNoEndpoint, "no available endpoint in pool "+p.Name)
	}
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
// takes one with Begin, fills its Input (ProxyHeader, Input), decides
// (Decide) and gives it back with End; Decider.Decide does all of it for
// an Input read elsewhere (route/spoe).
type Txn struct {
	in     Input
	v      Verdict
	req    fleet.Request
	hasher fleet.PrefixHasher
	blocks []uint64
	picks  [16]*fleet.Endpoint
	// idx is the request body, indexed once (route/payload).
	idx payload.Index
	// Buf is the transport's own memory, kept here so a request takes one
	// pooled object.
	Buf TxnBuffers
	// snap and start are the snapshot and the arrival time of a Begin.
	snap  *Snapshot
	start time.Time

	// serve and prefill are the policies' answers for the serving (decode)
	// and the prefill pool; their Endpoints are views into picks.
	serve, prefill fleet.Choice
	// pdh is the prefill call's header source (pd.go).
	pdh pdHeaders
	// names remembers what the request header names are (headers.go).
	names nameMemo
	// What the ledger and the request log keep of the decision
	// (decisions.go): the snapshot deciding, the deployment, the model as an
	// index into the snapshot's model names, the pool that had no endpoint.
	dsnap       *Snapshot
	dep         *Deployment
	model       int32
	refusedPool *fleet.Pool
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
func (s *Decider) Begin() *Txn {
	snap := s.snap.Load()
	sc := s.getScratch(snap.maxBlocks)
	sc.snap, sc.start = snap, time.Now()
	sc.in.Reset()
	return sc
}

// End gives a Txn back; nothing of it may be used after.
func (s *Decider) End(t *Txn) {
	t.snap = nil
	s.release(t)
}

// Config is the config of the Txn's snapshot (the limits a transport reads by).
func (t *Txn) Config() *config.Config { return t.snap.Config }

// Input is what the transport fills.
func (t *Txn) Input() *Input { return &t.in }

// ProxyHeader takes one request header of the proxy's call: the body-cut
// flag, the original URI and method, or a forwarded header (matched once
// per name and snapshot, headers.go); other headers are ignored.
func (t *Txn) ProxyHeader(name, value []byte) {
	if len(value) == 0 {
		return
	}
	in := &t.in
	switch kind, role := t.names.classify(t.snap, name); kind {
	case kindTruncated:
		in.Truncated = true
	case kindOrigURI:
		in.URI = value
	case kindOrigMethod:
		in.Method = value
	case kindForwarded:
		in.addHeader(name, value, role)
	}
}

// DecideTxn decides the Txn's Input on its snapshot and returns the Verdict
// (valid until End).
func (s *Decider) DecideTxn(t *Txn) *Verdict {
	s.decideInput(t.snap, &t.in, &t.v, t, t.start)
	if t.v.Status != 200 {
		s.logRefusal(t, &t.v, t.start)
	}
	return &t.v
}

func (s *Decider) getScratch(maxBlocks int) *Txn {
	sc, _ := s.pool.Get().(*Txn)
	if sc == nil {
		sc = &Txn{Buf: TxnBuffers{Out: make([]byte, 0, 512)}}
	}
	if cap(sc.blocks) < maxBlocks {
		sc.blocks = make([]uint64, 0, maxBlocks)
	}
	return sc
}

// release returns a request's scratch to the pool, after the test hook
// (observe) saw the request.
func (s *Decider) release(sc *Txn) {
	if s.observe != nil {
		s.observe(&sc.req)
	}
	s.pool.Put(sc)
}
