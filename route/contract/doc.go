// Package contract is the wire contract between the proxy glue (HAProxy
// Lua, the SPOE config, nginx/njs) and turnout: the paths, the headers a
// proxy sends and the ones turnout answers with, the reason codes and
// what every glue does with them, the feedback line, the glue's own
// errors, and the wire types of one request (Input) and its answer
// (Verdict). The renderers (haproxy/, nginx/) and the transports
// (route/httpapi, route/spoe) read it; it imports nothing of the decision
// engine, so the glue does not link it.
package contract
