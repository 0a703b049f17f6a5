package contract

import (
	"strings"

	"github.com/turnout/turnout/internal/config"
)

// The feedback line: one per finished request, sent by the proxy over
// syslog, that closes turnout's decision (feedback_line.go reads it):
//
//	turnout-done id=<decision> srv=<server> status=<code> ms=<total ms> ttfb=<ms> tft=<ms> [tok=<token>] ... term=<state>
//
// Fields are space-separated key=value pairs in any order; the reader
// ignores unknown keys. ttfb is the time to the replica's response headers
// (not to the first token); tft the time to its first response body bytes
// (the first token of a stream: vLLM sends its headers before it); each -1
// or "-" when unknown. Both proxies' log formats are rendered from
// FeedbackLineFields, so a field is added here once.

// Keys of the fields the reader acts on.
const (
	FeedbackFieldID     = "id"
	FeedbackFieldServer = "srv"
	FeedbackFieldStatus = "status"
	FeedbackFieldMs     = "ms"
	FeedbackFieldTTFB   = "ttfb"
	// FeedbackFieldFirstToken is the time from the request's arrival at the
	// proxy to the first response body bytes from the replica, in ms: the
	// proxies' body filters time it (FirstTokenHAProxyVar, FirstTokenNginxVar),
	// and without them the field is left out, never filled with the header
	// time.
	FeedbackFieldFirstToken = "tft"
	// FeedbackFieldToken carries the lines' token (feedback.token, or the
	// one of feedback.token_file: config.FeedbackConfig.LineToken).
	FeedbackFieldToken = "tok"
	// FeedbackFieldRetries is HAProxy's connection retries (%rc, "+N"
	// after a redispatch to another server), for the request log.
	FeedbackFieldRetries = "retries"
	// FeedbackFieldUpstream is the address of the replica that answered
	// (the last one tried): nginx's srv is turnout's choice even after
	// nginx retried the request on another replica of the pool.
	FeedbackFieldUpstream = "up"
)

// The variables the proxies' first-token timers set (HAProxy's frontend
// rules, nginx's njs body filter turnout.tft) and their log formats read.
const (
	FirstTokenHAProxyVar = "txn.turnout_tft"
	FirstTokenNginxVar   = "turnout_tft"
)

// FeedbackFieldTerm is how the stream ended, in HAProxy's %ts vocabulary
// (two characters: who ended it, at which stage; "--" a normal end): the
// first one says who cut it, TermCutBy reads it. nginx writes the same
// codes from $status and $request_completion (a map of nginx.conf.tmpl):
// "CD" for a client gone (499), "SD" for a response the replica left
// unfinished, "--" otherwise.
const FeedbackFieldTerm = "term"

// Who cut a stream (TermCutBy): the request log's "cut".
const (
	CutClient  = "client"
	CutReplica = "replica"
	CutProxy   = "proxy"
)

// TermCutBy reads the first character of a termination state: "" for a
// normal end ('-') or an unknown one, else who ended the stream (C and c,
// a client abort or timeout; S and s, the replica's; any other, the proxy
// itself: a resource limit, a rule, an internal error, a kill).
func TermCutBy(term []byte) string {
	if len(term) == 0 {
		return ""
	}
	switch term[0] {
	case '-':
		return ""
	case 'C', 'c':
		return CutClient
	case 'S', 's':
		return CutReplica
	}
	return CutProxy
}

// FeedbackField is one key=value field of the feedback line and what each
// proxy's log format writes for it ("" where that proxy does not).
type FeedbackField struct {
	Key string
	// HAProxy is a log-format expression, Nginx a log_format one.
	HAProxy, Nginx string
	// Read: the feedback reader acts on the field; the others are for
	// whoever reads the log.
	Read bool
	// Token: the value is feedback.token, written only when one is set.
	Token bool
	// FirstToken: written only with proxy.first_token_timing, which renders
	// the filters that set its variables.
	FirstToken bool
}

// FeedbackLineFields returns the feedback line's fields in the order the log
// formats write them.
func FeedbackLineFields() []FeedbackField {
	decision, server, pool := VerdictFieldNamed("decision"), VerdictFieldNamed("server"), VerdictFieldNamed("pool")
	return []FeedbackField{
		{Key: FeedbackFieldID, HAProxy: "%[var(" + decision.HAProxyVar + ")]", Nginx: "$" + decision.NginxVar, Read: true},
		{Key: FeedbackFieldServer, HAProxy: "%s", Nginx: "$" + server.NginxVar, Read: true},
		{Key: FeedbackFieldStatus, HAProxy: "%ST", Nginx: "$status", Read: true},
		// Total time: HAProxy's %Ta; nginx's $request_time in ms, a map of
		// nginx.conf.tmpl.
		{Key: FeedbackFieldMs, HAProxy: "%Ta", Nginx: "$turnout_ms", Read: true},
		// To the response headers: HAProxy's %Tr; nginx's
		// $upstream_header_time of the last upstream, in ms (a map).
		{Key: FeedbackFieldTTFB, HAProxy: "%Tr", Nginx: "$turnout_ttfb", Read: true},
		{Key: FeedbackFieldFirstToken, HAProxy: "%[var(" + FirstTokenHAProxyVar + ")]", Nginx: "$" + FirstTokenNginxVar, Read: true, FirstToken: true},
		{Key: FeedbackFieldToken, Read: true, Token: true},
		{Key: "be", HAProxy: "%b"},
		{Key: "tw", HAProxy: "%Tw"},
		{Key: "tc", HAProxy: "%Tc"},
		{Key: FeedbackFieldRetries, HAProxy: "%rc", Nginx: "$turnout_retries", Read: true},
		// The last address of nginx's $upstream_addr (a map).
		{Key: FeedbackFieldUpstream, HAProxy: "%si:%sp", Nginx: "$turnout_up", Read: true},
		{Key: "pool", Nginx: "$" + pool.NginxVar},
		{Key: FeedbackFieldTerm, HAProxy: "%ts", Nginx: "$turnout_term", Read: true},
	}
}

// FeedbackFormat renders the feedback line as a proxy's log format: expr
// picks the proxy's expression of a field (FeedbackField.HAProxy or
// .Nginx); the token field carries cfg's feedback.token, if any.
func FeedbackFormat(cfg *config.Config, expr func(FeedbackField) string) string {
	b := []string{FeedbackTag}
	for _, f := range FeedbackLineFields() {
		if f.FirstToken && !cfg.Proxy.FirstTokenTimed() {
			continue
		}
		v := expr(f)
		if f.Token {
			v = cfg.Feedback.LineToken()
		}
		if v != "" {
			b = append(b, f.Key+"="+v)
		}
	}
	return strings.Join(b, " ")
}

// FeedbackAuthField is the log-format text that carries the feedback token
// ("" without a token).
func FeedbackAuthField(cfg *config.Config) string {
	tok := cfg.Feedback.LineToken()
	if tok == "" {
		return ""
	}
	return FeedbackFieldToken + "=" + tok
}
