// Package route is turnout's decision core: it holds the live config as an
// atomic Snapshot (deployments, pools, endpoints with their state, one
// Policy per pool) and answers POST /internal/route with a verdict, the
// replica a proxy should send one request to.
//
// A decision runs these stages, without allocating:
//  1. read: the proxy's headers (session, model, truncation marker) and the
//     body up to max_body, within the buffered-bytes budget, indexed in one
//     pass (route/payload) that every later stage reads;
//  2. deployment: the model from the body (or a model header) selects it;
//     unknown model 404, none with several deployments 400;
//  3. pick: the pool's Policy (round-robin, least-request, session-hash,
//     prefix-affinity, kv-aware; policy_*.go) chooses an endpoint and
//     fallbacks among the healthy ones, hashing the prompt into blocks when
//     the policy wants it;
//     a prefill/decode deployment picks the decode endpoint, runs the
//     prefill itself (pd.go) and hands on kv_transfer_params;
//  4. verdict: the X-Turnout-* headers of contract.go, or a refusal with an
//     OpenAI-style JSON error and a reason the glue acts on; the decision
//     stays open until the proxy's feedback (/internal/done or the syslog
//     line) closes it, which keeps the load counters honest.
package route
