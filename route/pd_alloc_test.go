package route

import (
	"strings"
	"testing"

	"github.com/turnout/turnout/route/contract"
)

// pdDecisionAllocs bounds the allocations of one prefill/decode decision,
// the fake prefill replica's own included (it copies each body it gets).
// 10 before and after the prefill call moved to route/pd (issue 14): the PD
// path may not allocate more than it did.
const pdDecisionAllocs = 10

func TestPDDecisionAllocs(t *testing.T) {
	a := startFakePrefill(t)
	s := pdServer(t, "", a)
	ctx := routeCtx(chatBody("llama", strings.Repeat("long prompt ", 50), "q"), "s1")
	ctx.Request.Header.Set("Authorization", "Bearer k")
	ctx.Request.Header.Set("X-Request-Id", "r1")
	run := func() {
		ctx.Response.Reset()
		handle(s, ctx)
		if ctx.Response.StatusCode() != 200 || len(ctx.Response.Header.Peek(contract.HdrKVInsert)) == 0 {
			t.Fatalf("status %d: %s", ctx.Response.StatusCode(), ctx.Response.Body())
		}
		id, _ := contract.ParseDecisionID(ctx.Response.Header.Peek(contract.HdrDecision))
		s.Ledger().Complete(id)
	}
	for i := 0; i < 100; i++ {
		run()
	}
	n := testing.AllocsPerRun(200, run)
	t.Logf("%v allocations per PD decision", n)
	if n > pdDecisionAllocs {
		t.Fatalf("%v allocations per prefill/decode decision, more than %d", n, pdDecisionAllocs)
	}
}
