// Package route is turnout's decision core: it holds the live config as an
// atomic Snapshot (deployments, pools, endpoints with their state, one
// Policy per pool) and turns what a proxy sent about one request (an Input)
// into a Verdict, the replica it should go to, through one entry point,
// Server.Decide (verdict.go). Two transports read Inputs and write
// Verdicts: POST /internal/route (handler.go, X-Turnout-* headers) and the
// SPOE agent (route/spoe, txn variables). What the proxy glue does with a
// Verdict is one table, rendered into every glue (contract_glue.go).
//
// A decision runs these stages, without allocating:
//  1. read (the transport): the forwarded headers (ForwardedHeaders), the
//     original method and URI, the body up to max_body within the
//     buffered-bytes budget and whether it was cut, into an Input, the body indexed in one pass (route/payload)
//     that every later stage reads;
//  2. deployment: the model from the body (or a model header) selects it;
//     unknown model 404, none with several deployments 400;
//  3. pick: the pool's Policy (round-robin, least-request, session-hash,
//     prefix-affinity, kv-aware; policy_*.go) reads the Request (inputs
//     only: model, session, the prompt hashed into blocks when the policy
//     wants it, the payload index) and fills a Choice (outputs: an endpoint
//     and fallbacks among the healthy ones, best first, the Outcome for
//     metrics, the matched prefix, or a strict policy's Reject reason);
//     a prefill/decode deployment picks the decode endpoint, runs the
//     prefill itself on a prefill endpoint (pd.go picks and retries,
//     route/pd makes the call) and computes the body edit that hands on
//     kv_transfer_params (contract_body.go);
//  4. verdict: the Verdict (server, fallbacks, decision id, PD edit), or a
//     refusal with a status, an OpenAI-style JSON error and a reason the
//     glue acts on (GlueActionFor); the transport writes it. The decision
//     stays open until the proxy's feedback (/internal/done, or the syslog
//     line of contract.go read by feedback_line.go) closes it, which keeps
//     the load counters honest.
//
// What serves the decision without being part of it lives beside route:
// the config file poller (internal/filewatch), the connection limit whose
// refusal the glue reads (internal/netlimit, OverloadedAnswer), the config
// schema (internal/config).
package route
