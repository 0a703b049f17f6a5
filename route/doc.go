// Package route is turnout's decision core: the Decider holds the live
// config as an atomic Snapshot (deployments, pools, endpoints with their
// state, one Policy per pool), the policy registry and the decision ledger,
// and turns what a proxy sent about one request (a contract.Input) into a
// contract.Verdict, the replica it should go to (Decider.Decide; decide.go
// reads top to bottom). Transports read Inputs and write Verdicts:
// route/httpapi (POST /internal/route, X-Turnout-* headers), route/spoe
// (the SPOE agent, txn variables) and route/epp (the Endpoint Picker
// Protocol's ext_proc stream, ImmediateResponse refusals). The wire types
// and what the proxy glue does with a Verdict are route/contract, one set
// of tables rendered into every glue, which imports nothing of the engine.
//
// # Layers
//
// Bottom to top; a package imports only packages of lower layers, never
// one of its own layer or above (TestLayers reads this table and checks
// every route package's imports against it; a new package needs a row):
//
//	0 route/payload            reads a request body once into an index (model, prompt, token ids)
//	0 route/estimator          online TTFT models per replica (predicted-ttft), learned from completions
//	0 internal/suggest         the known name nearest a misspelt one ("did you mean")
//	0 internal/kvtopic         the KV-events topic template: rendered per endpoint, matched per message
//	0 internal/promtext        the Prometheus text format's family header and histogram bucket index
//	0 internal/tick            a function called on a ticker until it is done or its context ends
//	1 route/kv                 vLLM KV-cache events and the index of which replica holds which blocks
//	1 route/pd                 the prefill call of prefill/decode
//	1 internal/config          the config schema, defaults, validation, errors with line numbers
//	2 route/contract           the proxy contract: the wire types of a request and a verdict, paths, headers, reasons, the glue tables
//	2 route/tokenize           prompt text to KV block keys through vLLM's /tokenize, cached
//	2 route/fleet              the routing model policies read: Endpoint and its state, Pool, Request, Choice, Policy
//	3 route/policy             the policies and the registry that builds them by name
//	3 route/flow               flow control: hold decisions while a pool is saturated, release by class and tenant
//	3 route/models             which endpoints serve each model name and LoRA adapter (the model table)
//	3 route/feeds              which producer feeds which policy: the config's producers against the signals policies declare
//	3 route/internal/routetest helpers shared by the route packages' tests (tests only)
//	4 route                    the Decider: snapshot, decision pipeline, ledger, verdict
//	4 route/policy/toy         a policy added as one folder + one registration line (docs/policies.md; tests only)
//	5 route/httpapi            the HTTP transport and its server (/internal/route, /internal/done, /readyz, /metrics)
//	5 route/spoe               the SPOE agent (HAProxy's Stream Processing Offload)
//	5 route/epp                the Endpoint Picker (Envoy ext_proc gRPC) for Gateway API Inference Extension gateways
//	5 route/feedback           completion feedback (syslog lines), feedback health, stall detection
//	5 route/health             active health checks and the served-model checks
//	5 route/hints              log hints for settings the traffic shows do nothing (prefix prompts under one block)
//	5 route/engineload         engine load scraped from each replica's /metrics
//	5 route/cluster            prefix decisions and in-flight counts shared between turnout instances over NATS
//	5 route/reqlog             the request log's destinations (stdout, rotated file, syslog)
//	5 route/tracing            one OpenTelemetry span per decision, exported over OTLP
//
// Layer 5 packages hold a *Decider and use its exported API (Begin,
// ProxyHeaders, DecideTxn, End, Decide, OnApply) and the parts it
// exposes once each: Ledger (Complete, CloseDecision, CloseDecisionWith,
// Abandon, LookupDecision, SetRequestSink, SetTracer, SetFeedbackStalled,
// Reconcile, Counts), Health (the health checks' counts and first
// round), Refusals (what a transport refused on its own), Extras
// (AddMetrics, AddReadiness) and
// Ticker (the ledger's sweep and the hooks after it: Run, OnTick, Sweep);
// control wires them together. Inside route, a decision's stages are
// methods of its Txn (the pooled per-request memory, which holds the
// Decider), so the Decider keeps only what answers for the whole service.
//
// # A decision
//
// A decision runs these stages, without allocating:
//  1. read (the transport): the forwarded headers (ForwardedHeaders), the
//     original method and URI, the body up to max_body within the
//     buffered-bytes budget and whether it was cut, into an Input; the body
//     is indexed in one pass (route/payload) that every later stage reads;
//  2. deployment: the model from the body (or a model header) selects it
//     and the endpoints that serve it (route/models: base models and LoRA
//     adapters); unknown model 404, none with several deployments 400,
//     a model whose serving endpoints are all gone 503;
//  3. pick: the pool's Policy (route/policy) reads the fleet.Request
//     (inputs only: model, session, the prompt hashed into blocks when the
//     policy wants it, the payload index) and fills a fleet.Choice
//     (outputs: an endpoint and fallbacks among the healthy ones, best
//     first, the Outcome for metrics, the matched prefix, or a strict
//     policy's Reject reason; the Notes it wants logged), once per pass
//     of the deployment (decide.go's runPasses: a Pass is a pool and what
//     its pick is for; a profile is what a policy runs inside it,
//     route/policy): a mixed deployment has one, a
//     prefill/decode deployment two (the decode pool's pick, then the
//     prefill pool's unless the decode replica holds the prompt), after
//     which pd.go runs the prefill on the prefill pick (retried once,
//     route/pd makes the call) and computes the body edit that hands on
//     kv_transfer_params (route/contract/body.go);
//  4. verdict: the Verdict (server, fallbacks, decision id, PD edit), or a
//     refusal with a status, an OpenAI-style JSON error and a reason the
//     glue acts on (GlueActionFor); the transport writes it. The decision
//     stays open in the ledger (decisions.go) until the proxy's feedback
//     (/internal/done, or the syslog line of route/contract read by
//     route/feedback) closes it, which keeps the load counters honest;
//     its slot keeps what the request log and GET /internal/decision/<id>
//     show until the ring reuses it.
//
// What serves the decision without being part of it lives beside route:
// the config file poller (internal/filewatch), the connection limit whose
// refusal the glue reads (internal/netlimit, httpapi.OverloadedAnswer).
package route
