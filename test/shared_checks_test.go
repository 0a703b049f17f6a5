//go:build e2e

package e2e

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// Checks shared by the HAProxy and the nginx suites: the same client-visible
// contract through either proxy.

// frontend is a running proxy stack the shared checks drive.
type frontend interface {
	post(t *testing.T, path string, body []byte, hdr map[string]string) *Response
	// replicas lists the mock replicas serving model.
	replicas(model string) []*Mock
}

func (s *hstack) replicas(model string) []*Mock {
	for _, d := range s.deps {
		if d.name == model {
			return d.mocks
		}
	}
	return nil
}

func (s *nstack) replicas(model string) []*Mock { return s.dep(model).mocks }

// 1. One session id in three spellings lands on one replica; many sessions
// spread within 0.5-2x of a fair share. extra headers go with every request
// (e.g. the model header nginx header mode routes on).
func checkSessionSpellings(t *testing.T, s frontend, model string, extra map[string]string) {
	spellings := []string{"X-Session-ID", "x_session_id", "X_SESSION-id"}
	hdr := func(k, v string) map[string]string {
		h := map[string]string{k: v}
		for ek, ev := range extra {
			h[ek] = ev
		}
		return h
	}
	var first string
	for i := range 50 {
		r := s.post(t, "/v1/chat/completions", chatBody(model, "sys", fmt.Sprintf("q%d", i), false), hdr(spellings[i%3], "session-42"))
		rep := r.Header.Get("X-Replica")
		if r.Status != 200 || rep == "" {
			t.Fatalf("request %d: status %d replica %q: %s", i, r.Status, rep, r.Body)
		}
		if first == "" {
			first = rep
		}
		if rep != first {
			t.Fatalf("request %d with %s went to %s, earlier ones to %s", i, spellings[i%3], rep, first)
		}
	}
	counts := map[string]int{}
	const sessions = 200
	for i := range sessions {
		r := s.post(t, "/v1/chat/completions", chatBody(model, "sys", "hello", false), hdr("X-Session-ID", fmt.Sprintf("user-%d", i)))
		if r.Status != 200 {
			t.Fatalf("session %d: status %d", i, r.Status)
		}
		counts[r.Header.Get("X-Replica")]++
	}
	ms := s.replicas(model)
	fair := float64(sessions) / float64(len(ms))
	for _, m := range ms {
		if n := float64(counts[m.Name]); n < 0.5*fair || n > 2*fair {
			t.Errorf("replica %s got %v of %d sessions, want within 0.5-2x of %.0f (all: %v)", m.Name, n, sessions, fair, counts)
		}
	}
}

// 2. A shared long system prompt keeps landing on one replica; distinct
// prompts spread.
func checkPrefixRouting(t *testing.T, s frontend, model string) {
	system := strings.Repeat("You are a careful assistant for the turnout test suite. ", 40)
	var home string
	for i := range 20 {
		r := s.post(t, "/v1/chat/completions", chatBody(model, system, fmt.Sprintf("question number %d", i), false), nil)
		rep := r.Header.Get("X-Replica")
		if r.Status != 200 {
			t.Fatalf("shared prompt %d: status %d", i, r.Status)
		}
		if home == "" {
			home = rep
		}
		if rep != home {
			t.Fatalf("shared prompt %d went to %s, earlier ones to %s", i, rep, home)
		}
	}
	// The replica's prefix cache confirms the affinity paid off.
	for _, m := range s.replicas(model) {
		if m.Name == home && m.Stats().CachedTokens == 0 {
			t.Errorf("home replica %s reports no cached tokens", home)
		}
	}
	counts := map[string]int{}
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 30 {
		sys := fmt.Sprintf("%d %s", rng.Uint64(), strings.Repeat(fmt.Sprintf("topic %d ", rng.Uint64()), 60))
		r := s.post(t, "/v1/chat/completions", chatBody(model, sys, "q", false), nil)
		if r.Status != 200 {
			t.Fatalf("distinct prompt %d: status %d", i, r.Status)
		}
		counts[r.Header.Get("X-Replica")]++
	}
	for _, m := range s.replicas(model) {
		if counts[m.Name] == 0 {
			t.Errorf("distinct prompts never reached %s: %v", m.Name, counts)
		}
	}
}
