package route

import (
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/fleet"
	"github.com/turnout/turnout/route/payload"
	"github.com/turnout/turnout/route/pd"
)

// Prefill/decode disaggregation (vLLM's kv_transfer_params protocol, as the
// NIXL connector's toy proxy drives it): turnout picks a decode and a prefill
// replica (the two passes of decide.go's runPasses), sends the prefill
// itself (route/pd; payload.PrefillBody: max_tokens 1, not streamed, with
// do_remote_decode), retrying once on another prefill replica, and hands the
// prefill's kv_transfer_params to the proxy, which injects them into the
// request it streams to the decode replica.

// admitPD refuses what prefill/decode cannot route: the prefill needs the
// whole body, a JSON object, and kv_transfer_params is the router's to set.
func (t *Txn) admitPD(snap *Snapshot, r *fleet.Request, v *contract.Verdict) bool {
	switch {
	case r.Truncated:
		v.Refuse(fasthttp.StatusRequestEntityTooLarge, "invalid_request_error", contract.ReasonBodyTooLarge,
			fmt.Sprintf("prefill/decode routing needs the whole request body; it is larger than max_body (%d bytes)", snap.Config.MaxBody))
	case !r.Payload.Object():
		v.Refuse(fasthttp.StatusBadRequest, "invalid_request_error", "invalid_body",
			"prefill/decode routing needs a JSON object body")
	case len(snap.Deployments) > 1 && r.Payload.DuplicateModel(): // free: Object read the whole body
		refuseDuplicateModel(v, r.Payload)
	case r.Payload.Has(payload.KVTransferKey):
		v.Refuse(fasthttp.StatusBadRequest, "invalid_request_error", contract.ReasonClientKVParams,
			"kv_transfer_params is set by the router; clients must not send it")
	default:
		return true
	}
	return false
}

// skipPrefill reports whether the decode replica already holds most of the
// prompt (llm-d's heuristic): moving KV would cost more than recomputing,
// so the prefill pass does not run.
func (t *Txn) skipPrefill(dep *Deployment, r *fleet.Request, decode *fleet.Choice) bool {
	cfg := &dep.Config.PD
	m := decode.Matched
	if cfg.SkipPrefillBelow > 0 && dep.Serve.BlockBytes > 0 && m > 0 && r.PromptBytes-m*dep.Serve.BlockBytes < cfg.SkipPrefillBelow {
		t.d.m.pdPrefill[3].Add(1)
		return true
	}
	return false
}

// finishPD turns the two passes' picks into the verdict: the decode
// replica, after the prefill ran on the prefill pick (retried once on the
// next), with the body edit that hands on its kv_transfer_params. A skipped
// prefill serves on decode alone; an empty prefill pick serves aggregated
// or refuses (pd.no_prefill).
func (t *Txn) finishPD(snap *Snapshot, dep *Deployment, in *contract.Input, v *contract.Verdict, start time.Time) {
	r := &t.req
	cfg := &dep.Config.PD
	serve, pre := &t.choices[0], &t.choices[1]
	if pre.Reject == rejectSkipped {
		t.route(v, dep.Serve, serve, start)
		return
	}
	prefill := pre.Endpoints
	if len(prefill) == 0 {
		if cfg.NoPrefill == "aggregate" {
			t.d.log.Debug().Str(fleet.FieldDeployment, dep.Name).Str(fleet.FieldReason, "no prefill replica").Msg("serving aggregated on decode")
			t.d.m.pdPrefill[4].Add(1)
			t.route(v, dep.Serve, serve, start)
			return
		}
		v.RetryAfter = true
		v.Refuse(fasthttp.StatusServiceUnavailable, "service_unavailable", contract.ReasonNoPrefillEndpoint,
			"no available prefill replica in pool "+dep.Prefill.Name+" (pd.no_prefill: reject)")
		return
	}
	pstart := time.Now()
	kv, used, err := t.prefillWithRetry(in, snap, prefill, r.Payload, cfg.PrefillTimeout.D())
	t.prefillTime = time.Since(pstart)
	if err != nil {
		var st *pd.StatusError
		if errors.As(err, &st) && st.Status >= 400 && st.Status < 500 && len(st.Body) > contract.MaxAnswerBody {
			v.Refuse(st.Status, "invalid_request_error", contract.ReasonPrefillRejected,
				fmt.Sprintf("the prefill replica refused the request (status %d)", st.Status))
			return
		}
		if errors.As(err, &st) && st.Status >= 400 && st.Status < 500 {
			// The request itself is bad (e.g. too long): the decode replica
			// would say the same, so relay the replica's own answer.
			v.Status, v.Reason, v.Body = st.Status, contract.ReasonPrefillRejected, st.Body
			return
		}
		t.d.log.Warn().Err(err).Str(fleet.FieldDeployment, dep.Name).Msg("prefill failed")
		v.Refuse(fasthttp.StatusBadGateway, "server_error", contract.ReasonPrefillFailed,
			"prefill failed on every tried replica: "+err.Error())
		return
	}
	t.route(v, dep.Serve, serve, start)
	v.KVTransfer = make([]byte, base64.StdEncoding.EncodedLen(len(kv)))
	base64.StdEncoding.Encode(v.KVTransfer, kv)
	v.Prefill = used.NameHdr
	v.KVInsert, v.KVAt = payload.Edit(r.Payload, kv, nil)
	v.KVLen = len(r.Payload.Body()) + len(v.KVInsert)
}

// prefillWithRetry tries the first prefill replica, then one other; a
// request the replica refuses (4xx) is not retried.
func (t *Txn) prefillWithRetry(in *contract.Input, snap *Snapshot, eps []*fleet.Endpoint, body *payload.Index, timeout time.Duration) ([]byte, *fleet.Endpoint, error) {
	pbody, err := payload.PrefillBody(body)
	if err != nil {
		return nil, nil, err
	}
	// In the scratch: handed to pd as an interface, it would escape.
	t.pdh = pdHeaders{in: in, snap: snap}
	defer func() { t.pdh = pdHeaders{} }()
	call := pd.Call{URI: in.URI, Headers: &t.pdh, Body: pbody, Timeout: timeout}
	var errs []error
	for i, e := range eps {
		if i == 2 {
			break
		}
		call.Address = e.Address
		e.State.Inflight.Add(1)
		kv, err := t.d.pd.Prefill(&call)
		e.State.Inflight.Add(-1)
		if err == nil {
			if i > 0 {
				t.d.m.pdPrefill[1].Add(1)
			} else {
				t.d.m.pdPrefill[0].Add(1)
			}
			return kv, e, nil
		}
		var st *pd.StatusError
		if errors.As(err, &st) && st.Status >= 400 && st.Status < 500 {
			t.d.m.pdPrefill[2].Add(1)
			return nil, e, err
		}
		errs = append(errs, fmt.Errorf("%s: %w", e.Name, err))
	}
	t.d.m.pdPrefill[2].Add(1)
	return nil, nil, errors.Join(errs...)
}

// pdHeaders forwards to the prefill replica what it may need of the
// original request's headers: auth, the request id, the session headers,
// the W3C trace context (forwarded with tracing on).
type pdHeaders struct {
	in   *contract.Input
	snap *Snapshot
}

var _ pd.Headers = (*pdHeaders)(nil)

func (p *pdHeaders) CopyTo(h *fasthttp.RequestHeader) {
	for _, f := range p.in.Headers {
		k, v := f.Name, f.Value
		if contract.HeaderIs(k, []byte(contract.FwdAuthorization)) || contract.HeaderIs(k, []byte(contract.FwdRequestID)) ||
			contract.HeaderIs(k, traceparentNorm) || contract.HeaderIs(k, tracestateNorm) {
			h.SetBytesKV(k, v)
			continue
		}
		for _, sh := range p.snap.sessionHdrs {
			if contract.HeaderIs(k, sh) {
				h.SetBytesKV(k, v)
			}
		}
	}
}

// DecodeBody injects kv_transfer_params (raw JSON object) into a request
// body, as the proxy glue does for the decode replica: payload.DecodeBody,
// the reference the Lua, njs and SPOE implementations are tested against.
func DecodeBody(body, kv []byte) ([]byte, error) {
	var x payload.Index
	x.Build(body, false)
	return payload.DecodeBody(&x, kv)
}

// Prefills reports whether in goes to a prefill/decode deployment, whose
// decision runs a prefill and may take up to twice its prefill_timeout. The
// SPOE agent answers such a request's first call (bounded by route_timeout,
// so a dead turnout costs no more) with a mark, and HAProxy asks again on
// a second agent whose timeout covers the prefill (route/spoe). It reads
// the deployment as decideInput does: the body's model, else the model
// header, else the only deployment.
func (d *Decider) Prefills(in *contract.Input) bool {
	snap := d.snap.Load()
	pd := false
	for _, dep := range snap.Deployments {
		pd = pd || dep.Prefill != nil
	}
	if !pd {
		return false
	}
	if len(snap.Deployments) == 1 {
		return true
	}
	sc := d.txns.get(d, snap.maxBlocks)
	defer d.txns.pool.Put(sc)
	body := in.Body
	trunc := in.Truncated
	if len(body) > snap.Config.MaxBody {
		body, trunc = body[:snap.Config.MaxBody], true
	}
	sc.idx.Reset()
	sc.idx.Build(body, trunc)
	model := sc.idx.Model()
	if len(model) == 0 {
		for i := range in.Headers {
			h := &in.Headers[i]
			if len(h.Value) > 0 && snap.headerRole(h.Name)&hdrModel != 0 {
				model = h.Value
			}
		}
	}
	dep := snap.byModel[string(model)].d
	return dep != nil && dep.Prefill != nil
}
