//go:build e2e

package e2e

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// 200 ext_proc streams open at once on one gateway connection, each with
// an SSE response: every request is routed and served, every stream comes
// back whole through the response phase, every decision is closed by it
// (in-flight back to 0, the request log and the ledger say closed with
// the replica that served), and round-robin spreads the decisions evenly.
func TestEPP_E2E_Load200Streams(t *testing.T) {
	const n, replicas = 200, 4
	ms, addrs := eppMocks(t, replicas)
	s := startEPPStack(t, eppSpec{mocks: ms})
	ctx := ctx30(t)

	// The request phase of all of them first: 200 streams and decisions
	// open at the same time.
	streams := make([]*gwStream, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			r := chatRequest(fmt.Sprintf("load %d", i))
			if i%4 == 3 {
				r.Mode = modeBuffered
			}
			streams[i], errs[i] = s.gw.Pick(ctx, r)
		})
	}
	wg.Wait()
	primaries := map[string]int{}
	for i, st := range streams {
		if errs[i] != nil {
			t.Fatalf("request %d: %v", i, errs[i])
		}
		if st.Pick.Refused != 0 {
			t.Fatalf("request %d refused: %d %s %s", i, st.Pick.Refused, st.Pick.Reason, st.Pick.Body)
		}
		primaries[st.Pick.Dest[0]]++
	}
	if v := s.metric(t, "turnout_endpoint_inflight"); v != n {
		t.Fatalf("%v decisions in flight with %d streams open", v, n)
	}
	for _, a := range addrs {
		if primaries[a] != n/replicas {
			t.Fatalf("round-robin primaries %v: want %d each", primaries, n/replicas)
		}
	}

	// Then every upstream exchange and response phase, all at once.
	start := time.Now()
	results := make([]*gwResult, n)
	for i, st := range streams {
		wg.Go(func() { results[i], errs[i] = withEvents(st.Finish()) })
	}
	wg.Wait()
	t.Logf("%d SSE responses through the response phase in %v", n, time.Since(start))
	for i, r := range results {
		s.checkServed(t, r, errs[i])
	}
	s.waitClosed(t)
	for _, m := range ms {
		if got := m.Stats().Requests; got != n/replicas {
			t.Fatalf("%s served %d requests, want %d", m.Name, got, n/replicas)
		}
		if v := s.metric(t, "turnout_endpoint_decisions_total", fmt.Sprintf("endpoint=%q", m.Name)); v != n/replicas {
			t.Fatalf("%s: %v decisions, want %d", m.Name, v, n/replicas)
		}
	}
	if v := s.metric(t, "turnout_completions_total", `result="completed"`); v != n {
		t.Fatalf("%v completions, want %d", v, n)
	}
	var lines []logLine
	Eventually(t, 10*time.Second, "a request log line per decision", func() bool {
		lines = s.requestLog(t)
		return len(lines) >= n
	})
	seen := map[string]bool{}
	for _, l := range lines {
		if l.State != "closed" || l.Status != 200 || l.ServedBy != l.Endpoint || seen[l.Decision] {
			t.Fatalf("request log: %+v (seen before: %v)", l, seen[l.Decision])
		}
		seen[l.Decision] = true
	}
	for id := range seen {
		if l := s.ledger(t, id); l.State != "closed" || l.ServedBy == "" {
			t.Fatalf("GET /internal/decision/%s: %+v", id, l)
		}
	}
}
