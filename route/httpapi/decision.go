package httpapi

import (
	"bytes"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/contract"
)

// PathDecision + <id> answers what turnout knows of a recent decision:
// the request log's fields (docs/request-log.md) as one JSON object, for
// explaining a slow or misrouted request by the id the proxy logged
// (X-Turnout-Decision). Main listener only (never the admin listener: it
// names models and replicas), guarded like /internal/done.
const PathDecision = "/internal/decision/"

var pathDecisionB = []byte(PathDecision)

// decision answers GET /internal/decision/<id>: 200 with the fields, 404
// when the id is unknown or no longer recent, 400 when it is not an id.
func (a *API) decision(ctx *fasthttp.RequestCtx) {
	if !a.doneAllowed(ctx) {
		writeError(ctx, fasthttp.StatusForbidden, "permission_error", "forbidden",
			"decisions are shown to feedback.sources only, with "+contract.HdrToken+" when feedback.token is set")
		return
	}
	if !ctx.IsGet() && !ctx.IsHead() {
		ctx.Response.Header.Set("Allow", "GET, HEAD")
		writeError(ctx, fasthttp.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "use GET")
		return
	}
	id, ok := contract.ParseDecisionID(bytes.TrimPrefix(ctx.Path(), pathDecisionB))
	if !ok {
		writeError(ctx, fasthttp.StatusBadRequest, "invalid_request_error", "bad_id", "the path ends in a decision id from "+contract.HdrDecision)
		return
	}
	var r route.DecisionRecord
	if !a.d.Ledger().LookupDecision(id, time.Now(), &r) {
		writeError(ctx, fasthttp.StatusNotFound, "invalid_request_error", "unknown_decision",
			"unknown decision, or no longer recent (turnout keeps the last 15 minutes, within the ledger's ring)")
		return
	}
	var b bytes.Buffer
	l := zerolog.New(&b)
	r.Fields(l.Log()).Send()
	ctx.SetContentType("application/json")
	ctx.SetBody(b.Bytes())
}
