// Package epp is turnout's Endpoint Picker: the transport that answers
// Gateway API Inference Extension gateways (Istio, kgateway, agentgateway,
// GKE, Envoy AI Gateway, NGINX Gateway Fabric) over the Endpoint Picker
// Protocol, Envoy's ext_proc v3 gRPC stream. Each stream is one HTTP
// request: its headers and body become a contract.Input decided by the same
// Decider call as /internal/route and the SPOE agent; the pick goes back
// as the x-gateway-destination-endpoint header and envoy.lb dynamic
// metadata, a refusal as an ImmediateResponse; the response phase closes
// the decision as the proxy's feedback line does. docs/gateway-api.md
// maps every field.
//
// Files: server.go (the listener, grpc-go's server and stream loop), h2.go
// (the inline server, epp.server's default: HTTP/2 and gRPC on the
// connection's goroutine), h2stream.go (its streams), request.go (the
// request phase and the decision), answer.go (what goes back to the
// gateway), decode.go (the gateway's ProcessingRequest read off the wire
// by hand), wire.go (the hot answers encoded to the wire, the server's
// codec), response.go (the response phase), subset.go (the metadata the
// gateway sends: subset hint, served endpoint), health.go (gRPC health),
// tls.go (the listener's certificate).
package epp
