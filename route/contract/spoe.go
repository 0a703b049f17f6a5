package contract

import (
	"fmt"
	"strconv"
	"strings"
)

// The SPOE part of the glue contract: the names the agent (route/spoe) and
// the SPOE config (haproxy/, templates/haproxy-spoe.snippets.tmpl) must
// agree on. They live here, beside the HTTP contract, so the renderer does
// not import the agent. Changing a name here breaks deployed configs.
const (
	// SPOEMessageRoute is the spoe-message turnout answers; others get an empty ACK.
	SPOEMessageRoute = "turnout-route"
	// SPOEMessageRoutePD carries the same arguments on the second agent of
	// a config with prefill/decode deployments: turnout answers
	// SPOEMessageRoute with SPOEArgDeferPD for a prefill/decode request
	// with SPOEVarPD only, so that call stays within route_timeout, and
	// decides (running the prefill) on this one, whose timeout processing
	// covers the prefill.
	SPOEMessageRoutePD = "turnout-route-pd"

	// Arguments of SPOEMessageRoute.
	SPOEArgMethod  = "method" // method
	SPOEArgURI     = "uri"    // pathq
	SPOEArgHeaders = "hdrs"   // req.hdrs_bin
	SPOEArgBody    = "body"   // req.body
	// SPOEArgDeferPD (bool(true)) on SPOEMessageRoute: answer a
	// prefill/decode request with SPOEVarPD instead of deciding it. A
	// config without it (rendered before) gets whole decisions.
	SPOEArgDeferPD = "defer_pd"
	// SPOEArgSent (date(0,ms)) on SPOEMessageRoute: when HAProxy sent the
	// message, by its clock. A message read later than timeout processing
	// after it (a stopped turnout's backlog) was abandoned: it is not
	// decided. A config without it (rendered before) gets every decision.
	SPOEArgSent = "sent"

	// SPOEVarPrefix is the agent's "option var-prefix": its variables
	// arrive as txn.turnout.<name> (templates/haproxy-spoe.snippets.tmpl
	// spells txn.turnout. out).
	SPOEVarPrefix = "turnout"
	// Variables set in the txn scope, under SPOEVarPrefix.
	SPOEVarServer     = "server"      // chosen server (X-Turnout-Server)
	SPOEVarPool       = "pool"        // backend name (X-Turnout-Pool)
	SPOEVarDecision   = "decision"    // decision id for the feedback log line
	SPOEVarKVTransfer = "kv_transfer" // PD: base64 kv_transfer_params
	SPOEVarPrefill    = "prefill"     // PD: prefill server used
	SPOEVarStatus     = "status"      // turnout's status when it did not route (int)
	SPOEVarReason     = "reason"      // X-Turnout-Reason (a plain token)
	SPOEVarBody       = "body"        // JSON body of a 4xx or PD failure, to relay (always application/json)
	SPOEVarRetryAfter = "retry_after" // Retry-After of a relayed refusal (RetryAfterSeconds)
	SPOEVarPD         = "pd"          // 1: ask again with SPOEMessageRoutePD (int)
	// PD: what the decode backend's Lua filter inserts into the body, where
	// (0-based offset just after the body's opening brace), and the body's
	// new Content-Length -- exactly what the Lua action computes.
	SPOEVarKV    = "kv"
	SPOEVarKVAt  = "kv_at"
	SPOEVarKVLen = "cl"
	// Fallback servers go to fb1..fbN in the order use-server tries them.
	SPOEVarFallbackPrefix = "fb"
	// SPOEMaxFallbackVars caps the fallback variables (the renderer caps fallbacks at 8).
	SPOEMaxFallbackVars = 8
)

// spoeTxnVar prefixes an agent variable's name into the txn variable
// HAProxy stores it in (VerdictField.HAProxyVar).
const spoeTxnVar = "txn." + SPOEVarPrefix + "."

// spoeFallbackVars are the fallback variable names fb1..fbN.
var spoeFallbackVars = func() (v [SPOEMaxFallbackVars]string) {
	for i := range v {
		v[i] = SPOEVarFallbackPrefix + strconv.Itoa(i+1)
	}
	return v
}()

// SPOEFallbackVar returns the name of the fallback variable i (0-based);
// i must be below SPOEMaxFallbackVars.
func SPOEFallbackVar(i int) string { return spoeFallbackVars[i] }

// SPOEFallbackVars returns the names of the first n fallback variables.
func SPOEFallbackVars(n int) []string {
	return append([]string(nil), spoeFallbackVars[:min(max(n, 0), SPOEMaxFallbackVars)]...)
}

// SPOEVarNames lists every variable the agent may set, for the SPOE file's
// register-var-names (HAProxy ignores an agent's unregistered variables).
func SPOEVarNames(fallbacks int) []string {
	var v []string
	for _, f := range verdictFields {
		if f.SPOEVar != "" && f.Kind != KindList {
			v = append(v, f.SPOEVar)
		}
	}
	return append(v, SPOEFallbackVars(fallbacks)...)
}

// SPOEConfig is the glue contract (glue.go) as the SPOE snippets
// of templates/haproxy-spoe.snippets.tmpl use it (haproxy/ renders them).
type SPOEConfig struct {
	// RelayStatuses are the statuses the config relays (RelayStatuses
	// and the 5xx of relayed reasons), when the agent set a body.
	RelayStatuses []int
	// ReasonVar is the txn variable of the reason (the agent's, which the
	// fail mode overwrites); KVLenVar the agent's body length variable.
	ReasonVar, KVLenVar string
	// StatusVar, AgentReasonVar and BodyVar are the agent's variables of a
	// relayed answer; ReasonHeader and RetryAfterHeader name its headers,
	// RetryAfterVar the agent variable of the latter.
	StatusVar, AgentReasonVar, BodyVar            string
	ReasonHeader, RetryAfterHeader, RetryAfterVar string
	FailClosedStatus                              int
	// FailClosedPre + reason + FailClosedPost is the fail-closed JSON.
	FailClosedPre, FailClosedPost string
	TooLarge                      struct {
		Status     int
		Code, Body string
	}
}

// NewSPOEConfig builds the SPOE view of the contract. The error bodies go into single-quoted HAProxy strings
// (lf-string for fail-closed): they must hold no quote and no '%'.
func NewSPOEConfig() (SPOEConfig, error) {
	c := SPOEConfig{RelayStatuses: RelayStatuses()}
	for _, r := range ReasonRules() {
		if r.Action == GlueRelay && r.Status >= 500 && !containsInt(c.RelayStatuses, r.Status) {
			c.RelayStatuses = append(c.RelayStatuses, r.Status)
		}
	}
	for _, f := range VerdictFields() {
		switch {
		case f.Name == "reason":
			c.ReasonVar, c.ReasonHeader = f.HAProxyVar, strings.ToLower(f.Header)
		case f.Name == "kv_len":
			c.KVLenVar = f.SPOEVar
		case f.Name == "retry_after":
			c.RetryAfterHeader, c.RetryAfterVar = strings.ToLower(f.Header), f.SPOEVar
		}
	}
	c.StatusVar, c.AgentReasonVar, c.BodyVar = SPOEVarStatus, SPOEVarReason, SPOEVarBody
	fc := FailClosedError
	c.FailClosedStatus = fc.Status
	c.FailClosedPre, c.FailClosedPost, _ = strings.Cut(fc.JSON(), ReasonToken)
	tl := DecodeTooLargeError
	c.TooLarge.Status, c.TooLarge.Code, c.TooLarge.Body = tl.Status, tl.Code, tl.JSON()
	for _, s := range []string{c.FailClosedPre, c.FailClosedPost, c.TooLarge.Body} {
		if strings.ContainsAny(s, `'%\`) {
			return c, fmt.Errorf("glue error body %q cannot go into a quoted HAProxy string", s)
		}
	}
	return c, nil
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
