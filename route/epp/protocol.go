package epp

// The Endpoint Picker Protocol's names (GIE
// docs/proposals/004-endpoint-picker-protocol, v1.0.0).
const (
	// HdrDestination carries the picked endpoints, primary first, as
	// ip:port,ip:port (the same value as MetaDestination).
	HdrDestination = "x-gateway-destination-endpoint"
	// NSDestination is the dynamic metadata namespace of the pick, and of
	// the served endpoint the gateway reports back.
	NSDestination = "envoy.lb"
	// MetaDestination is the pick's key in NSDestination.
	MetaDestination = HdrDestination
	// MetaServed is the endpoint that answered, in the metadata_context of
	// the response phase.
	MetaServed = "x-gateway-destination-endpoint-served"
	// NSSubset and MetaSubset: the subset hint, a list of ip:port the
	// pick must stay within.
	NSSubset   = "envoy.lb.subset_hint"
	MetaSubset = "x-gateway-destination-endpoint-subset"

	// The gRPC health services.
	HealthLiveness  = "liveness"
	HealthReadiness = "readiness"
	HealthExtProc   = "envoy.service.ext_proc.v3.ExternalProcessor"
)

// Reasons of the refusals this transport makes itself (x-turnout-reason).
const (
	// ReasonPD: a prefill/decode deployment's request; turnout runs the
	// prefill itself and edits the body, which this transport does not do.
	ReasonPD = "epp_pd_unsupported"
	// ReasonBodyMode: the gateway's request_body_mode is neither
	// FULL_DUPLEX_STREAMED, BUFFERED nor NONE.
	ReasonBodyMode = "epp_body_mode_unsupported"
)
