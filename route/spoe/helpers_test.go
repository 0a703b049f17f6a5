package spoe

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"testing"

	"github.com/turnout/turnout/internal/config"

	"github.com/turnout/turnout/route"
)

// The HAProxy side of SPOP, for tests: encoders for what HAProxy sends and a
// decoder for the agent's ACK.

// targ is one message argument.
type targ struct {
	name string
	typ  byte
	val  []byte
}

func strArg(name, v string) targ { return targ{name, typeString, []byte(v)} }

// deferPD is the first agent's bool(true) that defers prefill/decode decisions.
func deferPD(args []targ) []targ { return append(args, targ{ArgDeferPD, typeBool, []byte{1}}) }

// sentArg is date(0,ms): HAProxy's clock when it sent the message.
func sentArg(ms int64) targ { return targ{ArgSent, typeInt64, AppendVarint(nil, uint64(ms))} }
func binArg(name string, v []byte) targ {
	return targ{name, typeBinary, v}
}

// routeArgs are the arguments the snippet template sends.
func routeArgs(method, uri string, body string, hdrs ...string) []targ {
	return []targ{
		strArg(ArgMethod, method),
		strArg(ArgURI, uri),
		binArg(ArgHeaders, hdrsBin(hdrs...)),
		binArg(ArgBody, []byte(body)),
	}
}

// hdrsBin encodes name/value pairs like req.hdrs_bin.
func hdrsBin(kv ...string) []byte {
	var b []byte
	for i := 0; i+1 < len(kv); i += 2 {
		b = appendString(b, kv[i])
		b = appendString(b, kv[i+1])
	}
	return append(b, 0, 0)
}

// messagesPayload encodes a LIST-OF-MESSAGES with one message.
func messagesPayload(name string, args []targ) []byte {
	b := appendString(nil, name)
	b = append(b, byte(len(args)))
	for _, a := range args {
		b = appendString(b, a.name)
		switch a.typ {
		case typeNull:
			b = append(b, typeNull)
		case typeBool:
			t := typeBool
			if len(a.val) > 0 && a.val[0] != 0 {
				t |= flagTrue
			}
			b = append(b, t)
		case typeInt64:
			b = append(append(b, a.typ), a.val...) // a varint, no length
		default:
			b = appendBytes(append(b, a.typ), a.val)
		}
	}
	return b
}

// rawFrame encodes a frame with its length prefix.
func rawFrame(typ byte, flags uint32, stream, frame uint64, payload []byte) []byte {
	b := beginFrame(nil, typ, flags, stream, frame)
	return endFrame(append(b, payload...))
}

func haproxyHello(maxFrame uint32, healthcheck bool) []byte {
	var kv []byte
	kv = appendString(kv, "supported-versions")
	kv = appendStringValue(kv, []byte("2.0"))
	kv = appendString(kv, "max-frame-size")
	kv = appendUint32Value(kv, maxFrame)
	kv = appendString(kv, "capabilities")
	kv = appendStringValue(kv, []byte("pipelining,async"))
	if healthcheck {
		kv = appendString(kv, "healthcheck")
		kv = append(kv, typeBool|flagTrue)
	}
	kv = appendString(kv, "engine-id")
	kv = appendStringValue(kv, []byte("test-engine"))
	return rawFrame(frameHAProxyHello, flagFin, 0, 0, kv)
}

// vars decodes an ACK payload's set-var actions into name -> value.
func vars(t testing.TB, payload []byte) map[string]string {
	t.Helper()
	out := map[string]string{}
	for len(payload) > 0 {
		if len(payload) < 3 || payload[0] != actionSetVar || payload[1] != 3 || payload[2] != scopeTxn {
			t.Fatalf("unexpected action bytes % x", payload[:min(8, len(payload))])
		}
		name, n, err := readBytes(payload[3:])
		if err != nil {
			t.Fatalf("action name: %v", err)
		}
		v, k, err := readValue(payload[3+n:])
		if err != nil {
			t.Fatalf("action value: %v", err)
		}
		switch v.Type {
		case typeString, typeBinary:
			out[string(name)] = string(v.Bytes)
		case typeInt32, typeInt64:
			out[string(name)] = strconv.FormatInt(int64(int32(v.Int)), 10)
		default:
			t.Fatalf("var %s has type %d", name, v.Type)
		}
		payload = payload[3+n+k:]
	}
	return out
}

// decideOnce runs one message through a fresh decider.
func decideOnce(t testing.TB, a *Agent, args []targ) map[string]string {
	t.Helper()
	return decideMsg(t, a, MessageRoute, args)
}

// decideMsg is decideOnce with the message name (MessageRoutePD: the
// second call of a prefill/decode request).
func decideMsg(t testing.TB, a *Agent, msg string, args []targ) map[string]string {
	t.Helper()
	d := newDecider(a.srv, a.names)
	out, err := ack(d, header{StreamID: 7, FrameID: 1}, messagesPayload(msg, args), nil, 1<<20)
	if err != nil {
		t.Fatalf("ack: %v", err)
	}
	h, payload, err := readHeader(out[4:])
	if err != nil || h.Type != frameAck || h.StreamID != 7 || h.FrameID != 1 || h.Flags != flagFin {
		t.Fatalf("ack header %+v: %v", h, err)
	}
	if got := int(binary.BigEndian.Uint32(out)); got != len(out)-4 {
		t.Fatalf("frame length %d, want %d", got, len(out)-4)
	}
	v := vars(t, payload)
	// Close the decision as HAProxy's log line would: open decisions count
	// as in-flight load and would move sessions (bounded-load hashing).
	if id, err := strconv.ParseUint(v[VarDecision], 16, 64); err == nil {
		a.srv.Ledger().Complete(id)
	}
	return v
}

func mustAgent(t testing.TB, yaml string) *Agent {
	t.Helper()
	cfg, err := config.ParseConfig([]byte(yaml))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	srv, err := route.New(cfg, route.Options{Seed: 42})
	if err != nil {
		t.Fatalf("server: %v", err)
	}
	t.Cleanup(srv.Close)
	return New(srv, Options{})
}

func chatBody(model, user string) string {
	return fmt.Sprintf(`{"model":%q,"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":%q}],"stream":true}`, model, user)
}

// twoDeployments: session-hash "llama" (4 replicas) and round-robin "qwen" (2).
const twoDeployments = `
session_headers: [x-session-id, x-user]
model_headers: [x-model]
fallbacks: 2
health: {disable: true}
deployments:
  - name: llama
    models: [llama]
    policy: {name: session-hash}
    pools:
      - role: mixed
        endpoints:
          - {name: a, address: 127.0.0.1:8001}
          - {name: b, address: 127.0.0.1:8002}
          - {name: c, address: 127.0.0.1:8003}
          - {name: d, address: 127.0.0.1:8004}
  - name: qwen
    models: [qwen]
    policy: {name: round-robin}
    pools:
      - role: mixed
        endpoints:
          - {name: q0, address: 127.0.0.1:8101}
          - {name: q1, address: 127.0.0.1:8102}
`

// oneDeployment: a single least-request deployment (no model needed).
const oneDeployment = `
session_headers: [x-session-id]
fallbacks: 1
health: {disable: true}
deployments:
  - name: solo
    models: [solo]
    policy: {name: least-request}
    pools:
      - role: mixed
        endpoints:
          - {name: s0, address: 127.0.0.1:8201}
          - {name: s1, address: 127.0.0.1:8202}
          - {name: s2, address: 127.0.0.1:8203}
`
