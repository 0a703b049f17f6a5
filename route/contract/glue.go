package contract

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
)

// The glue contract as data. The HAProxy Lua action, the nginx njs and the
// SPOE config are rendered from these tables (haproxy/, nginx/): the glue
// code keeps only mechanics (call turnout, copy the fields the table names,
// relay or apply the fail mode as the table says, insert bytes). Adding a
// verdict field is a row in verdictFields plus its tests.

// FieldKind says how a glue carries a verdict field.
type FieldKind string

// Field kinds.
const (
	KindString FieldKind = "string" // copied as it is
	KindList   FieldKind = "list"   // comma-separated in the header; one variable per item
	KindInt    FieldKind = "int"    // an SPOE integer variable
	KindBase64 FieldKind = "base64" // base64 in the header and the SPOE variable
	// KindText64 is base64 in the header (it may hold any byte) and the
	// text itself in the SPOE variable and the glue's.
	KindText64 FieldKind = "text64"
)

// VerdictField is one field of a Verdict as each transport and glue
// names it; "" where a transport or glue does not carry it.
type VerdictField struct {
	Name string
	// Header is the HTTP answer's header (route/httpapi writes it).
	Header string
	// SPOEVar is the agent's variable (txn.turnout.<SPOEVar>); a list's
	// items go to SPOEVar1..N.
	SPOEVar string
	// HAProxyVar is the txn variable haproxy.cfg reads: the SPOE agent's
	// own variable (spoeTxnVar), which the Lua sets too, so the SPOE
	// config needs no copy of it; a list's items get 1..N.
	HAProxyVar string
	// NginxVar is the js_var the njs sets (without the '$').
	NginxVar string
	Kind     FieldKind
	// Required: an answer without it is a bad answer (fail mode).
	Required bool
	// Asked: the HTTP answer carries Header only when the call names the
	// field in HdrWant (Wants). For a field one glue reads: the others
	// would pay for a header on every answer.
	Asked bool

	get func(*Verdict) []byte // a routed string field's value
	hdr []byte                // Header, for fasthttp
}

var verdictFields = [...]VerdictField{
	{Name: "server", Header: HdrServer, SPOEVar: SPOEVarServer, HAProxyVar: spoeTxnVar + SPOEVarServer, NginxVar: "turnout_server", Kind: KindString, Required: true,
		get: func(v *Verdict) []byte { return v.Server }},
	{Name: "fallbacks", Header: HdrFallbacks, SPOEVar: SPOEVarFallbackPrefix, HAProxyVar: spoeTxnVar + SPOEVarFallbackPrefix, Kind: KindList},
	// Not an SPOE variable: HAProxy routes by server name.
	{Name: "addr", Header: HdrBackend, NginxVar: "turnout_backend", Kind: KindString,
		get: func(v *Verdict) []byte { return v.Addr }},
	// The first fallback's address, for a glue that reaches replicas by
	// address (nginx): where a request refused before any byte goes next.
	{Name: "fallback_addr", Header: HdrFallbackBackend, NginxVar: "turnout_fallback", Kind: KindString, Asked: true,
		get: func(v *Verdict) []byte { return v.FallbackAddr }},
	{Name: "pool", Header: HdrPool, SPOEVar: SPOEVarPool, HAProxyVar: spoeTxnVar + SPOEVarPool, NginxVar: "turnout_pool", Kind: KindString,
		get: func(v *Verdict) []byte { return v.Pool }},
	{Name: "decision", Header: HdrDecision, SPOEVar: SPOEVarDecision, HAProxyVar: spoeTxnVar + SPOEVarDecision, NginxVar: "turnout_decision", Kind: KindString,
		get: (*Verdict).DecisionHex},
	// kv_transfer_params reach the HTTP glue inside kv_insert only.
	{Name: "kv_transfer", SPOEVar: SPOEVarKVTransfer, Kind: KindBase64,
		get: func(v *Verdict) []byte { return v.KVTransfer }},
	{Name: "prefill", Header: HdrPrefill, SPOEVar: SPOEVarPrefill, Kind: KindString,
		get: func(v *Verdict) []byte { return v.Prefill }},
	{Name: "reason", Header: HdrReason, SPOEVar: SPOEVarReason, HAProxyVar: spoeTxnVar + SPOEVarReason, Kind: KindString},
	// A refusal's Retry-After (RetryAfterSeconds), relayed with it.
	{Name: "retry_after", Header: HdrRetryAfter, SPOEVar: SPOEVarRetryAfter, Kind: KindString},
	{Name: "status", SPOEVar: SPOEVarStatus, Kind: KindInt},
	{Name: "body", SPOEVar: SPOEVarBody, Kind: KindString},
	// The body edit (body.go): the glue inserts kv_insert at byte
	// kv_at; the body is then kv_len bytes long.
	{Name: "kv_insert", Header: HdrKVInsert, SPOEVar: SPOEVarKV, HAProxyVar: spoeTxnVar + SPOEVarKV, Kind: KindText64},
	{Name: "kv_at", Header: HdrKVAt, SPOEVar: SPOEVarKVAt, HAProxyVar: spoeTxnVar + SPOEVarKVAt, Kind: KindInt},
	{Name: "kv_len", SPOEVar: SPOEVarKVLen, Kind: KindInt},
}

// routedFields are the rows every transport writes the same way for a
// routed Verdict: a string value read by get (the other rows need a
// transport's own encoding: a list, the body edit, a refusal's fields).
var routedFields = func() (out []VerdictField) {
	for _, f := range verdictFields {
		if f.get != nil {
			f.hdr = []byte(f.Header)
			out = append(out, f)
		}
	}
	return out
}()

// RoutedFields returns the rows a transport writes for a routed Verdict
// by Value: the table the writers loop over, so a new row needs no new
// writer code. Shared: do not modify.
func RoutedFields() []VerdictField { return routedFields }

// Value is the field's value in v (nil when empty or not a routed field).
func (f *VerdictField) Value(v *Verdict) []byte {
	if f.get == nil {
		return nil
	}
	return f.get(v)
}

// Wants reports whether want, a HdrWant value (comma-separated field
// names, spaces allowed), names the field called name.
func Wants(want []byte, name string) bool {
	for item := range bytes.SplitSeq(want, []byte{','}) {
		if string(bytes.TrimSpace(item)) == name {
			return true
		}
	}
	return false
}

// VerdictFields returns (a copy of) the verdict field table.
func VerdictFields() []VerdictField { return append([]VerdictField(nil), verdictFields[:]...) }

// VerdictField returns the row called name; it panics on an unknown name
// (a renderer bug, caught by every render test).
func VerdictFieldNamed(name string) VerdictField {
	for _, f := range verdictFields {
		if f.Name == name {
			return f
		}
	}
	panic("route: no verdict field " + name)
}

// GlueFields are the verdict rows by the part the glue code gives them, so
// each renderer only spells them in its own language.
type GlueFields struct {
	// Required is the row whose absence makes an answer bad (fail mode).
	Required VerdictField
	// Fallbacks, Reason, RetryAfter, EditInsert and EditAt have mechanics
	// of their own (a list, the refusal's headers, the body edit).
	Fallbacks, Reason, RetryAfter, EditInsert, EditAt VerdictField
	// Copied are the routed string rows with a header, which a glue copies
	// as they are into its variable (a glue skips a row it has no variable
	// for).
	Copied []VerdictField
}

// GlueVerdict sorts the verdict table for the glue renderers.
func GlueVerdict() GlueFields {
	g := GlueFields{Fallbacks: VerdictFieldNamed("fallbacks"), Reason: VerdictFieldNamed("reason"),
		RetryAfter: VerdictFieldNamed("retry_after"),
		EditInsert: VerdictFieldNamed("kv_insert"), EditAt: VerdictFieldNamed("kv_at")}
	for _, f := range verdictFields {
		if f.Required {
			g.Required = f
		}
		if f.Header != "" && f.get != nil {
			g.Copied = append(g.Copied, f)
		}
	}
	return g
}

// GlueAction is what every glue does with a turnout answer that names no
// replica.
type GlueAction string

// Glue actions.
const (
	// GlueRelay answers the client with turnout's status, reason and JSON
	// body: a verdict about the request (unknown model, bad body), or a
	// prefill that ran and failed (serving without it would be wrong).
	GlueRelay GlueAction = "relay"
	// GlueFailMode applies proxy.fail_mode: open serves the request with
	// the proxy's own balancing, closed answers FailClosedBody (503).
	GlueFailMode GlueAction = "fail"
)

// ReasonRule is one reason whose action is not the default of its status
// class (GlueActionFor).
type ReasonRule struct {
	Reason string
	Status int
	Action GlueAction
}

// reasonRules: the one relay table of every glue, so the glues cannot
// disagree: a 4xx is relayed unless turnout could not read the call, and a
// 5xx fails over unless it is a prefill/decode failure. prefill_rejected
// is a 4xx and so relayed by the default.
var reasonRules = [...]ReasonRule{
	{ReasonHeaderTooLarge, StatusHeaderTooLarge, GlueFailMode},
	{ReasonReadTimeout, 408, GlueFailMode},
	{ReasonBadRequest, 400, GlueFailMode},
	{ReasonPrefillFailed, 502, GlueRelay},
	{ReasonNoPrefillEndpoint, 503, GlueRelay},
	// Failing open would send the model to a replica that answers 404.
	{ReasonModelUnavailable, 503, GlueRelay},
}

// ReasonRules returns (a copy of) the reason table.
func ReasonRules() []ReasonRule { return append([]ReasonRule(nil), reasonRules[:]...) }

// GlueActionFor is the rule every glue applies to turnout's non-200
// answer: the reason's row if it has one, else relay a 4xx and apply the
// fail mode to anything else (5xx, no answer).
func GlueActionFor(status int, reason []byte) GlueAction {
	for _, r := range reasonRules {
		if string(reason) == r.Reason {
			return r.Action
		}
	}
	if status >= 400 && status < 500 {
		return GlueRelay
	}
	return GlueFailMode
}

// relayStatuses are the 4xx statuses relayed as they are; any other
// relayed 4xx reaches the client as 400, with turnout's reason and body.
// The list exists because HAProxy's "http-request return status" takes a
// constant; the Lua and njs apply the same mapping so that all three glues
// answer alike.
var relayStatuses = [...]int{400, 401, 403, 404, 405, 409, 413, 415, 422, 429}

// RelayStatuses returns (a copy of) the 4xx statuses relayed as they are.
func RelayStatuses() []int { return append([]int(nil), relayStatuses[:]...) }

// RelayStatus is the status a glue relays turnout's status st with.
func RelayStatus(st int) int {
	if st >= 500 {
		return st
	}
	for _, s := range relayStatuses {
		if s == st {
			return st
		}
	}
	return 400
}

// GlueError is an error the glue answers itself, without turnout's body.
type GlueError struct {
	Status        int
	Type, Code    string
	Message       string
	ReasonIsToken bool // Code is the failure's reason, filled in by the glue
}

// JSON is the error's OpenAI-style body. For a ReasonIsToken error the
// code is ReasonToken, which the glue replaces with the reason.
func (e GlueError) JSON() string {
	code := e.Code
	if e.ReasonIsToken {
		code = ReasonToken
	}
	b, _ := json.Marshal(apiError{Error: apiErrorBody{Message: e.Message, Type: e.Type, Code: code}})
	return string(b)
}

// JSONWith is the error's body with reason in place of ReasonToken (the
// proxy's expression for the failure's reason: nginx's "$var", HAProxy's
// "%[var(...)]"); for an error without the token it is JSON.
func (e GlueError) JSONWith(reason string) string {
	return strings.Replace(e.JSON(), ReasonToken, reason, 1)
}

// Reason is the X-Turnout-Reason the glue sends with the error: its code
// (a ReasonIsToken error's reason is the failure's own).
func (e GlueError) Reason() string { return e.Code }

// ReasonToken stands for the failure's reason in a GlueError's JSON.
const ReasonToken = "REASON"

// Reasons of the glue's own errors.
const (
	ReasonNotFound       = "not_found"       // 404: a path the proxy does not serve
	ReasonUpstreamFailed = "upstream_failed" // 502: the replica failed, and the retry through its pool
)

// BodyTooLargeError answers a body over max_body (maxBody bytes) in a glue
// that refuses it before asking turnout (nginx holds the whole body).
func BodyTooLargeError(maxBody int) GlueError {
	return GlueError{Status: 413, Type: "invalid_request_error", Code: ReasonBodyTooLarge,
		Message: "request body larger than " + strconv.Itoa(maxBody) + " bytes"}
}

// The errors the glue produces itself.
var (
	// FailClosedError answers a request turnout did not route under
	// fail_mode closed.
	FailClosedError = GlueError{Status: 503, Type: "service_unavailable", Message: "routing unavailable", ReasonIsToken: true}
	// DecodeTooLargeError: the decode body with kv_transfer_params does not
	// fit the proxy buffer.
	DecodeTooLargeError = GlueError{Status: 413, Type: "invalid_request_error", Code: "decode_body_too_large",
		Message: "the request body with the prefill kv_transfer_params does not fit the proxy buffer"}
	// RefusedError replaces a relayed body that is empty or does not fit
	// the SPOE frame.
	RefusedError = GlueError{Status: 400, Type: "invalid_request_error", Code: "refused", Message: "request refused by the router"}
	// NotFoundError answers a path outside PathServed, under
	// PathInternal, or matching UnsafePathRegex: the proxy serves only the
	// API.
	NotFoundError = GlueError{Status: 404, Type: "invalid_request_error", Code: ReasonNotFound, Message: "not found"}
	// UpstreamFailedError: the replica turnout picked failed, and so did the
	// retry through its pool (nginx).
	UpstreamFailedError = GlueError{Status: 502, Type: "server_error", Code: ReasonUpstreamFailed, Message: "the replica failed"}
)

// BadAnswerReason is the fail-mode reason of an answer without its
// Required fields or with a bad body edit.
const BadAnswerReason = "route-bad-answer"
