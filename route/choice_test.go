package route

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/turnout/turnout/route/fleet"
	"github.com/turnout/turnout/route/internal/routetest"
	"github.com/turnout/turnout/route/payload"
)

// Every policy writes its answer into the Choice and only reads the
// Request: the Request after Pick equals the one before, field by field and
// down to the Blocks view (kv-aware's prefix fallback used to leave its own
// block buffer, returned to a sync.Pool, in the Request).
func TestPickFillsChoiceNotRequest(t *testing.T) {
	toks := seqToks(64, 100)
	for _, tc := range []struct {
		name    string
		policy  string // fourEndpoints policy, or kv-aware params (kv)
		kv      bool
		body    string
		session string
		warm    bool // pick once first (prefix policies learn the prompt)
		n       int  // endpoints wanted
		// want
		picks   int
		outcome fleet.Outcome
		matched bool
		reject  fleet.RejectReason
	}{
		{name: "round-robin", policy: "round-robin", body: body4K(1), n: 3, picks: 3, outcome: fleet.OutcomeBalanced},
		{name: "least-request", policy: "least-request", body: body4K(1), n: 2, picks: 2, outcome: fleet.OutcomeBalanced},
		{name: "session-hash, session", policy: "session-hash", body: body4K(1), session: "user-1", n: 3, picks: 3, outcome: fleet.OutcomeAffinity},
		{name: "session-hash, none: least-request", policy: "session-hash", body: body4K(1), n: 1, picks: 1, outcome: fleet.OutcomeBalanced},
		{name: "prefix-affinity, first sight", policy: "prefix-affinity", body: body4K(1), n: 2, picks: 2, outcome: fleet.OutcomeBalanced},
		{name: "prefix-affinity, seen", policy: "prefix-affinity", body: body4K(1), warm: true, n: 2, picks: 2, outcome: fleet.OutcomeAffinity, matched: true},
		{name: "kv-aware, token ids held", kv: true, policy: "block_size: 4, tokenizer: {mode: none}", body: tokBody(toks), n: 2, picks: 2, outcome: fleet.OutcomeAffinity, matched: true},
		{name: "kv-aware, prefix fallback, seen", kv: true, policy: "block_size: 4, tokenizer: {mode: none}", body: body4K(1), warm: true, n: 2, picks: 2, outcome: fleet.OutcomeAffinity, matched: true},
		{name: "kv-aware strict, no token ids", kv: true, policy: "block_size: 4, strict: true, tokenizer: {mode: none}", body: body4K(1), n: 2, picks: 0, outcome: fleet.OutcomeBalanced, reject: fleet.RejectBadBody},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p *fleet.Pool
			if tc.kv {
				s, k := kvServer(t, tc.policy)
				store(k.Index(), "b", toks, 4)
				p = s.Snapshot().Deployments[0].Serve
			} else {
				p = mustServer(t, fmt.Sprintf(fourEndpoints, tc.policy)).Snapshot().Deployments[0].Serve
			}
			var idx payload.Index
			idx.Build([]byte(tc.body), false)
			r := &fleet.Request{Model: idx.Model(), Payload: &idx}
			if tc.session != "" {
				r.Session, r.HasSession, r.SessionHash = []byte(tc.session), true, fleet.HashKey([]byte(tc.session))
			}
			if p.BlockBytes > 0 { // as Server.pick does for a PromptUser
				var h fleet.PrefixHasher
				h.Reset(p.BlockBytes, make([]uint64, 0, 64))
				idx.Prompt(&h)
				r.Blocks, r.PromptBytes = h.Out, h.Total
			}
			before := *r
			if tc.warm {
				routetest.Choose(p, r, tc.n)
			}
			c := routetest.Choose(p, r, tc.n)
			if !reflect.DeepEqual(before, *r) || (len(r.Blocks) > 0 && &before.Blocks[0] != &r.Blocks[0]) {
				t.Fatalf("Pick changed the Request:\nbefore %+v\nafter  %+v", before, *r)
			}
			if len(c.Endpoints) != tc.picks || c.Outcome != tc.outcome || (c.Matched > 0) != tc.matched || c.Reject != tc.reject {
				t.Fatalf("choice %s outcome %v matched %d reject %d; want %d picks, %v, matched %v, reject %d",
					routetest.Names(c.Endpoints), c.Outcome, c.Matched, c.Reject, tc.picks, tc.outcome, tc.matched, tc.reject)
			}
			seen := map[*fleet.Endpoint]bool{}
			for _, e := range c.Endpoints {
				if seen[e] || !e.Available() {
					t.Fatalf("choice %s: repeated or unavailable endpoint", routetest.Names(c.Endpoints))
				}
				seen[e] = true
			}
		})
	}
}
