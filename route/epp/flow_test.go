package epp

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/turnout/turnout/route/contract"
)

const flowYAML = `
health: {disable: true}
deployments:
  - name: d
    models: [m]
    flow_control:
      trust: {priority_header: true, tenant_header: true}
      saturation: {max_load: 1}
      classes:
        - {name: critical}
        - {name: standard, max_wait: 1m}
        - {name: sheddable, max_wait: 50ms, shed: true}
    pools:
      - endpoints:
          - {name: a, address: 10.0.5.1:8000}
`

func metric(h *harness, name string) string {
	var b strings.Builder
	h.d.WriteMetrics(&b)
	for _, l := range strings.Split(b.String(), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			return v
		}
	}
	return ""
}

const queuedStandard = `turnout_flow_queued{deployment="d",class="standard",tenant="none"}`

// saturate takes the one replica's room with a routed request whose
// decision stays open.
func saturate(t *testing.T, h *harness) {
	g := h.open(t)
	g.send(chatHeaders(false))
	g.sendBody(chat("m", "first"), 64<<10)
	routed(t, g.recv())
}

// Flow control's shed is a 429 ImmediateResponse with turnout's JSON
// error and Retry-After.
func TestEPP_ShedIs429(t *testing.T) {
	h := newHarness(t, flowYAML)
	saturate(t, h)
	g := h.open(t)
	g.send(chatHeaders(false, "x-priority", "sheddable"))
	g.sendBody(chat("m", "hi"), 64<<10)
	f := refused(t, g.recv())
	if f.status != 429 || f.reason != contract.ReasonFlowShed || f.code != contract.ReasonFlowShed || f.retry == "" {
		t.Fatalf("%+v", f)
	}
}

// A held request is a held stream: its answer comes when a completion
// frees the pool.
func TestEPP_HoldIsAHeldStream(t *testing.T) {
	h := newHarness(t, flowYAML)
	first := h.open(t)
	first.send(chatHeaders(false))
	first.sendBody(chat("m", "first"), 64<<10)
	routed(t, first.recv())
	first.recv() // the body chunk

	g := h.open(t)
	g.send(chatHeaders(false))
	g.sendBody(chat("m", "held"), 64<<10)
	eventually(t, 10*time.Second, func() error {
		if m := metric(h, queuedStandard); m != "1" {
			return fmt.Errorf("queued %q", m)
		}
		return nil
	})
	// The first request's response completes it: the held one goes.
	first.send(respHeaders("200", "", false))
	first.recv()
	first.send(respBody([]byte("done"), true))
	first.recv()
	if p := routed(t, g.recv()); p.header != "10.0.5.1:8000" {
		t.Fatalf("released to %q", p.header)
	}
}

// A gateway that cancels mid-stream releases everything: the held
// decision leaves the queue, the held bytes return to the budget, and no
// goroutine stays behind.
func TestEPP_ClientCancelReleasesEverything(t *testing.T) {
	h := newHarness(t, flowYAML)
	saturate(t, h)
	base := runtime.NumGoroutine()

	held := h.open(t)
	held.send(chatHeaders(false))
	held.sendBody(chat("m", "held"), 64<<10)
	eventually(t, 10*time.Second, func() error {
		if m := metric(h, queuedStandard); m != "1" {
			return fmt.Errorf("queued %q", m)
		}
		return nil
	})
	mid := h.open(t)
	mid.send(chatHeaders(false))
	mid.send(reqBody(chat("m", strings.Repeat("x", 1000)), false)) // no end_of_stream
	eventually(t, 10*time.Second, func() error {
		if n := h.s.budget.used.Load(); n == 0 {
			return fmt.Errorf("the mid-body bytes are not held yet")
		}
		return nil
	})
	held.cancel()
	mid.cancel()
	eventually(t, 10*time.Second, func() error {
		if m := metric(h, queuedStandard); m != "0" {
			return fmt.Errorf("queued %q after cancel", m)
		}
		if n := h.s.budget.used.Load(); n != 0 {
			return fmt.Errorf("%d bytes still held", n)
		}
		if n := runtime.NumGoroutine(); n > base {
			return fmt.Errorf("%d goroutines, %d before the streams", n, base)
		}
		return nil
	})
}
