package route

import "strconv"

// The SPOE part of the glue contract: the names the agent (route/spoe) and
// the SPOE config (haproxy/, templates/haproxy-spoe.snippets.tmpl) must
// agree on. They live here, beside the HTTP contract, so the renderer does
// not import the agent. Changing a name here breaks deployed configs.
const (
	// SPOEMessageRoute is the spoe-message turnout answers; others get an empty ACK.
	SPOEMessageRoute = "turnout-route"

	// Arguments of SPOEMessageRoute.
	SPOEArgMethod  = "method" // method
	SPOEArgURI     = "uri"    // pathq
	SPOEArgHeaders = "hdrs"   // req.hdrs_bin
	SPOEArgBody    = "body"   // req.body

	// Variables set in the txn scope; HAProxy prefixes them with the agent's
	// var-prefix (txn.turnout.server with "option var-prefix turnout").
	SPOEVarServer     = "server"      // chosen server (X-Turnout-Server)
	SPOEVarAddr       = "addr"        // its address (X-Turnout-Backend)
	SPOEVarPool       = "pool"        // backend name (X-Turnout-Pool)
	SPOEVarDecision   = "decision"    // decision id for the feedback log line
	SPOEVarKVTransfer = "kv_transfer" // PD: base64 kv_transfer_params
	SPOEVarPrefill    = "prefill"     // PD: prefill server used
	SPOEVarStatus     = "status"      // turnout's status when it did not route (int)
	SPOEVarReason     = "reason"      // X-Turnout-Reason (a plain token)
	SPOEVarBody       = "body"        // JSON body of a 4xx or PD failure, to relay (always application/json)
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

// SPOERelay is a turnout answer the SPOE config relays to the client as it
// is, by status and reason.
type SPOERelay struct {
	Status int
	Reason string
}

// spoeRelayStatuses are the 4xx codes the snippet template relays as they
// are ("http-request return status" takes a constant); the agent reports
// any other 4xx as 400, keeping turnout's reason and body.
var spoeRelayStatuses = [...]int{400, 404, 405, 409, 413, 415, 422, 429}

// spoeRelayPD are turnout's prefill/decode failures that reach the client
// as they are (the prefill ran and failed: serving without it would be
// wrong), by status and reason.
var spoeRelayPD = [...]SPOERelay{
	{502, ReasonPrefillFailed},
	{503, ReasonNoPrefillEndpoint},
}

// spoeFallbackVars are the fallback variable names fb1..fbN.
var spoeFallbackVars = func() (v [SPOEMaxFallbackVars]string) {
	for i := range v {
		v[i] = SPOEVarFallbackPrefix + strconv.Itoa(i+1)
	}
	return v
}()

// SPOERelayStatuses returns (a copy of) the 4xx codes the SPOE config relays.
func SPOERelayStatuses() []int { return append([]int(nil), spoeRelayStatuses[:]...) }

// SPOERelaysStatus reports whether the SPOE config relays status st as it is.
func SPOERelaysStatus(st int) bool {
	for _, s := range spoeRelayStatuses {
		if s == st {
			return true
		}
	}
	return false
}

// SPOERelayPD returns (a copy of) the PD failures the SPOE config relays.
func SPOERelayPD() []SPOERelay { return append([]SPOERelay(nil), spoeRelayPD[:]...) }

// SPOERelaysPD reports whether the SPOE config relays the PD failure
// (status, reason) to the client as it is.
func SPOERelaysPD(st int, reason []byte) bool {
	for _, r := range spoeRelayPD {
		if r.Status == st && string(reason) == r.Reason {
			return true
		}
	}
	return false
}

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
	v := []string{SPOEVarServer, SPOEVarAddr, SPOEVarPool, SPOEVarDecision, SPOEVarKVTransfer, SPOEVarPrefill,
		SPOEVarStatus, SPOEVarReason, SPOEVarBody, SPOEVarKV, SPOEVarKVAt, SPOEVarKVLen}
	return append(v, SPOEFallbackVars(fallbacks)...)
}
