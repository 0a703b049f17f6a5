package route

import (
	"fmt"
	"testing"

	"github.com/turnout/turnout/internal/config"
)

// The memo answers what matching answers, for names of every keyed length
// and beyond, in any spelling, on first sight and from memory, and forgets
// what it learnt under an older snapshot.
func TestNameMemo(t *testing.T) {
	yaml := func(session string) string {
		return fmt.Sprintf(`
session_headers: [%s]
health: {disable: true}
deployments:
  - name: llama
    models: [llama]
    policy: {name: session-hash}
    pools:
      - role: mixed
        endpoints:
          - {name: a, address: 127.0.0.1:8001}
`, session)
	}
	s := mustServer(t, yaml("x-user"))
	names := []string{
		"X-User", "x_user", "X-USER", "X-Users", "Host", "Accept", "", "A",
		"Content-Type", "content_type", "Content-Length", "X-Request-Id", "X-Request-Ie",
		"X-Original-URI", "x-original-uri", "X-Original-Method", "X-Body-Truncated",
		"X-Body-Truncatee", "Authorization", "X-A-Very-Long-Header-Name-Indeed",
	}
	var m nameMemo
	check := func(snap *Snapshot) {
		t.Helper()
		for round := range 3 { // first sight, then from memory
			for _, n := range names {
				k, r := m.classify(snap, []byte(n))
				wk, wr := snap.classify([]byte(n))
				if k != wk || r != wr {
					t.Errorf("round %d: %q = (%d, %b), want (%d, %b)", round, n, k, r, wk, wr)
				}
			}
		}
	}
	snap := s.snap.Load()
	check(snap)
	if k, r := m.classify(snap, []byte("x_user")); k != kindForwarded || r&hdrSession == 0 {
		t.Fatalf("x_user = (%d, %b), want a forwarded session header", k, r)
	}
	// A reload that makes x-user an ordinary header and x-tenant the session
	// header: the memo must not answer from the old snapshot.
	cfg, err := config.ParseConfig([]byte(yaml("x-tenant")))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	next := s.snap.Load()
	if next.gen == snap.gen {
		t.Fatalf("reload kept snapshot generation %d", next.gen)
	}
	names = append(names, "X-Tenant")
	check(next)
	if k, _ := m.classify(next, []byte("x_user")); k != kindOther {
		t.Errorf("x_user after the reload = %d, want an ordinary header", k)
	}
}
