package contract

import "encoding/json"

// Header is one forwarded request header, as views.
type Header struct {
	Name, Value []byte
	// Role is what the reader already matched the name as (route's
	// session/model bits; 0: not matched, the decision matches it).
	Role uint8
}

// Watch tells flow control whether the client of a held request went away.
type Watch interface{ Gone() bool }

// Input is what the proxy sent turnout about one request, whatever the
// transport (the HTTP call read by route/httpapi, an SPOE message of route/spoe).
// Every slice is a view into the transport's buffers, valid during Decide.
type Input struct {
	// Method and URI are the client's (X-Original-Method, X-Original-URI).
	Method, URI []byte
	// Headers are the forwarded request headers (ForwardedHeaders); names
	// are matched without regard to case or '-'/'_'.
	Headers []Header
	// Body is the request body, or its first bytes when Truncated.
	Body      []byte
	Truncated bool
	// Watch tells flow control whether the client left while its request
	// is held (nil: not known; only asked with flow control on).
	Watch Watch
	// Subset, when set, restricts the serving pool's candidates (subsetOnly).
	Subset *Subset
	// Repeat: the call repeats one already refused (HdrRepeat); its
	// refusal is neither counted nor logged a second time.
	Repeat bool
	// Want is the call's HdrWant: the asked verdict fields to answer with.
	Want []byte
}

// Subset restricts one request's candidates to the endpoints at these
// addresses (host:port, as configured or discovered): a gateway's subset
// hint (the Endpoint Picker Protocol's x-gateway-destination-endpoint-subset).
// Input.Subset nil: every endpoint of the pool, at no cost.
type Subset struct {
	Addrs [][]byte
}

// Reset empties in, keeping the header slice's room for the next request.
func (in *Input) Reset() {
	*in = Input{Headers: in.Headers[:0]}
}

// AddHeader appends a forwarded header (views).
func (in *Input) AddHeader(name, value []byte) {
	in.Headers = append(in.Headers, Header{Name: name, Value: value})
}

// AddHeaderRole appends a forwarded header whose role the reader already
// found, so the decision does not compare its name again.
func (in *Input) AddHeaderRole(name, value []byte, role uint8) {
	in.Headers = append(in.Headers, Header{Name: name, Value: value, Role: role})
}

// Verdict is everything turnout answers about one request. The HTTP
// handler writes it as X-Turnout-* headers (or an error answer), the SPOE
// agent as txn variables; the field names are in glue.go. The
// slices are views into the snapshot (names, which never change) or into
// the Verdict's own buffers: valid until the Verdict is reused.
type Verdict struct {
	// Status is 200 when a replica was chosen; otherwise the refusal's
	// status, with Reason and Body.
	Status int
	// Server, Addr and Pool name the chosen replica, its address and its
	// pool (the proxy's backend).
	Server, Addr, Pool []byte
	// Fallbacks are the servers to try after Server, in order;
	// FallbackAddr is the first one's address (nil without fallbacks).
	Fallbacks    [][]byte
	FallbackAddr []byte
	// Decision is the id the proxy's feedback closes (DecisionHex).
	Decision uint64
	// PD: KVTransfer is base64(kv_transfer_params), Prefill the prefill
	// server that ran. KVInsert is inserted into the body at byte offset
	// KVAt, which makes the body KVLen bytes long (BodyEdit).
	KVTransfer []byte
	Prefill    []byte
	KVInsert   []byte
	KVAt       int
	KVLen      int
	// Reason is the reason code of a refusal (X-Turnout-Reason).
	Reason string
	// Body is a refusal's OpenAI-style JSON error (or the prefill
	// replica's own 4xx answer).
	Body []byte
	// RetryAfter asks the client to retry in a second.
	RetryAfter bool

	fb  [16][]byte
	hex [16]byte
}

// Routed reports whether v names a replica.
func (v *Verdict) Routed() bool { return v.Status == 200 }

// DecisionHex returns the decision id as 16 hex digits (X-Turnout-Decision).
func (v *Verdict) DecisionHex() []byte { return appendID(v.hex[:0], v.Decision) }

// FallbackRoom is v's own room for Fallbacks, empty: a decision appends to
// it without allocating.
func (v *Verdict) FallbackRoom() [][]byte { return v.fb[:0] }

// Reset empties v field by field: the fallback and hex buffers are only
// read through Fallbacks and DecisionHex, so they need no clearing.
func (v *Verdict) Reset() {
	v.Status, v.Server, v.Addr, v.Pool, v.Fallbacks, v.FallbackAddr, v.Decision = 0, nil, nil, nil, nil, nil, 0
	v.KVTransfer, v.Prefill, v.KVInsert, v.KVAt, v.KVLen = nil, nil, nil, 0, 0
	v.Reason, v.Body, v.RetryAfter = "", nil, false
}

// Refuse makes v an OpenAI-style error answer. Errors are rare, so
// encoding/json's allocations are fine here.
func (v *Verdict) Refuse(status int, typ, code, msg string) {
	v.Status, v.Reason = status, code
	v.Body = ErrorBody(typ, code, msg)
}

// ErrorBody is the OpenAI error envelope, bounded by MaxAnswerBody.
func ErrorBody(typ, code, msg string) []byte {
	if len(msg) > MaxAnswerBody/2 { // JSON escaping may double it
		msg = msg[:MaxAnswerBody/2-3] + "..."
	}
	b, _ := json.Marshal(apiError{Error: apiErrorBody{Message: msg, Type: typ, Code: code}})
	return b
}

// apiError is the OpenAI error envelope.
type apiError struct {
	Error apiErrorBody `json:"error"`
}

type apiErrorBody struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Code    string `json:"code"`
}
