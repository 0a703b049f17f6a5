package route

import (
	"fmt"
	"strings"
	"testing"

	"github.com/turnout/turnout/route/contract"
)

// A subset hint narrows every policy's pick to the hinted endpoints, and
// a warm decision with a hint allocates nothing either.
func TestSubsetHintNarrowsThePickWithoutAllocating(t *testing.T) {
	for _, pol := range []string{"least-request", "session-hash", "prefix-affinity", "round-robin"} {
		t.Run(pol, func(t *testing.T) {
			s := mustServer(t, fmt.Sprintf(fourEndpoints, pol))
			defer s.Close()
			sub := &contract.Subset{Addrs: [][]byte{[]byte("127.0.0.1:8002"), []byte("127.0.0.1:8004")}}
			body := []byte(body4K(1))
			var v contract.Verdict
			var in contract.Input
			run := func() {
				in = contract.Input{Body: body, Subset: sub}
				s.Decide(&in, &v)
				if v.Status != 200 || (string(v.Server) != "b" && string(v.Server) != "d") {
					t.Fatalf("status %d server %s, want b or d", v.Status, v.Server)
				}
				for _, f := range v.Fallbacks {
					if string(f) != "b" && string(f) != "d" {
						t.Fatalf("fallback %s outside the hint", f)
					}
				}
				s.Ledger().Complete(v.Decision)
			}
			for range 100 {
				run()
			}
			if n := testing.AllocsPerRun(200, run); n != 0 {
				t.Fatalf("%v allocations per decision with a hint", n)
			}
		})
	}
}

// Hinted endpoints that exist but cannot serve now are a 503 no_endpoint,
// not a pick elsewhere.
func TestSubsetHintOfUnavailableEndpoints(t *testing.T) {
	s := mustServer(t, strings.Replace(fmt.Sprintf(fourEndpoints, "round-robin"), "127.0.0.1:8002}", "127.0.0.1:8002, draining: true}", 1))
	defer s.Close()
	in := contract.Input{Body: []byte(body4K(1)), Subset: &contract.Subset{Addrs: [][]byte{[]byte("127.0.0.1:8002")}}}
	var v contract.Verdict
	s.Decide(&in, &v)
	if v.Status != 503 || v.Reason != contract.ReasonNoEndpoint {
		t.Fatalf("status %d reason %s server %s", v.Status, v.Reason, v.Server)
	}
}
