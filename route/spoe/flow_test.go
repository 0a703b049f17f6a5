package spoe

import (
	"fmt"
	"strconv"
	"testing"
	"time"
)

// With flow control a held decision runs on a worker: the frames behind it
// on the same connection are answered at once, and the held one is
// answered when a completion frees its pool, with the X-Priority and
// tenant headers read from req.hdrs_bin.
func TestHeldDecisionDoesNotHoldTheConnection(t *testing.T) {
	a := mustAgent(t, twoDeployments+`
  - name: fc
    models: [fc]
    flow_control:
      trust: {priority_header: true, tenant_header: true}
      saturation: {max_load: 1}
    pools:
      - role: mixed
        endpoints: [{name: f0, address: 127.0.0.1:8201}]
`)
	c, br, _ := agentConn(t, a, 16380)
	frame := func(stream uint64, model string, hdrs ...string) []byte {
		args := routeArgs("POST", "/v1/chat/completions", chatBody(model, "hi"), hdrs...)
		return rawFrame(frameNotify, flagFin, stream, 1, messagesPayload(MessageRoute, args))
	}
	_, _ = c.Write(frame(1, "fc")) // admitted: f0 is at max_load now
	h, p := readFrame(t, br)
	first := vars(t, p)
	if h.StreamID != 1 || first[VarServer] != "f0" {
		t.Fatalf("first ACK stream %d vars %v", h.StreamID, first)
	}
	start := time.Now()
	_, _ = c.Write(frame(2, "fc", "X_Priority", "critical", "x-tenant-id", "acme")) // held
	_, _ = c.Write(frame(3, "qwen"))
	h, _ = readFrame(t, br)
	if h.StreamID != 3 || time.Since(start) > time.Second {
		t.Fatalf("first ACK is stream %d after %v, want the unheld decision (3) first", h.StreamID, time.Since(start))
	}
	// Stream 2 reaches flow control on its worker, maybe after stream 3's
	// answer: completing f0's request before it is queued would admit it
	// at once rather than release it.
	const queued = `turnout_flow_queued{deployment="fc",class="critical",tenant="acme"}`
	eventually(t, 5*time.Second, func() error {
		if m := metric(a.srv, queued); m != "1" {
			return fmt.Errorf("queued %q", m)
		}
		return nil
	})
	id, err := strconv.ParseUint(first[VarDecision], 16, 64)
	if err != nil || !a.srv.Ledger().Complete(id) {
		t.Fatalf("cannot complete %q", first[VarDecision])
	}
	h, p = readFrame(t, br)
	if v := vars(t, p); h.StreamID != 2 || v[VarServer] != "f0" {
		t.Fatalf("held ACK stream %d vars %v", h.StreamID, v)
	}
	if m := metric(a.srv, `turnout_flow_requests_total{deployment="fc",class="critical",tenant="acme",outcome="released"}`); m != "1" {
		t.Fatalf("released metric %q, want 1 for critical/acme", m)
	}
}

// A held frame whose SPOE connection closes is dropped: HAProxy can no
// longer take its answer.
func TestHeldFrameDroppedWhenConnectionCloses(t *testing.T) {
	a := mustAgent(t, oneFlowDeployment)
	c, br, _ := agentConn(t, a, 16380)
	args := routeArgs("POST", "/v1/chat/completions", chatBody("fc", "hi"))
	_, _ = c.Write(rawFrame(frameNotify, flagFin, 1, 1, messagesPayload(MessageRoute, args)))
	if h, p := readFrame(t, br); h.StreamID != 1 || vars(t, p)[VarServer] != "f0" {
		t.Fatalf("first ACK stream %d", h.StreamID)
	}
	_, _ = c.Write(rawFrame(frameNotify, flagFin, 2, 1, messagesPayload(MessageRoute, args)))
	const queued = `turnout_flow_queued{deployment="fc",class="standard",tenant="none"}`
	eventually(t, 5*time.Second, func() error {
		if m := metric(a.srv, queued); m != "1" {
			return fmt.Errorf("queued %q", m)
		}
		return nil
	})
	c.Close()
	eventually(t, 5*time.Second, func() error {
		if m := metric(a.srv, `turnout_flow_requests_total{deployment="fc",class="standard",tenant="none",outcome="gone"}`); m != "1" {
			return fmt.Errorf("gone %q, queued %q", m, metric(a.srv, queued))
		}
		return nil
	})
}

const oneFlowDeployment = `
health: {disable: true}
deployments:
  - name: fc
    models: [fc]
    flow_control:
      trust: {priority_header: true, tenant_header: true}
      saturation: {max_load: 1}
    pools:
      - role: mixed
        endpoints: [{name: f0, address: 127.0.0.1:8201}]
`
