package route

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/turnout/turnout/route/contract"
)

// A request for a name no list names yet, while an endpoint has not
// listed its models (never up, or up less than health.models_wait ago), is
// answered 503 with Retry-After (it may be one of that endpoint's
// adapters), not 404; once the list is read it is routed, and a name still
// unlisted is 404; an endpoint whose list is overdue no longer holds 404s
// back, nor does any endpoint without active health checks.
func TestAdapterWhileListPending(t *testing.T) {
	checked := strings.Replace(fmt.Sprintf(fourEndpoints, "round-robin"), "health: {disable: true}", "health: {interval: 1h}", 1)
	s := mustServer(t, checked)
	defer s.Close()
	full := base("meta-llama/Llama-3.1-8B-Instruct")
	for _, n := range []string{"a", "b", "c"} {
		setServed(s, n, base("llama"), full)
	}
	d := s.Snapshot().EndpointByServer([]byte("d"))
	s.RefreshModels()
	ask := func(model string) (int, string, string) {
		ctx := do(s, fmt.Sprintf(`{"model":%q,"prompt":"x"}`, model))
		return ctx.Response.StatusCode(), hdr(ctx, contract.HdrReason), hdr(ctx, contract.HdrRetryAfter)
	}
	if status, reason, ra := ask("sql"); status != 503 || reason != contract.ReasonModelUnavailable || ra == "" {
		t.Fatalf("adapter while d was never up: %d %q retry-after %q, want 503 %s with Retry-After", status, reason, ra, contract.ReasonModelUnavailable)
	}
	d.State.UpAt.Store(time.Now().UnixNano()) // passed a health check, list not read yet
	if status, reason, ra := ask("sql"); status != 503 || reason != contract.ReasonModelUnavailable || ra == "" {
		t.Fatalf("adapter while d's list is pending: %d %q retry-after %q, want 503 %s with Retry-After", status, reason, ra, contract.ReasonModelUnavailable)
	}
	if status, _, _ := ask("llama"); status != 200 {
		t.Fatalf("base model while a list is pending: %d", status)
	}
	setServed(s, "d", base("llama"), full, lora("sql"))
	got, status, _ := servers(s, "sql", 4)
	if status != 200 || got["d"] != 4 {
		t.Fatalf("sql once d listed it: %d %v", status, got)
	}
	if status, reason, _ := ask("nope"); status != 404 {
		t.Fatalf("unlisted name with every list known: %d %s", status, reason)
	}
	// An endpoint whose list never came: past models_wait, 404 again.
	d.SetServed(nil)
	s.RefreshModels()
	if status, _, _ := ask("nope"); status != 503 {
		t.Fatalf("d's list unknown again, within the wait: %d", status)
	}
	d.State.UpAt.Store(time.Now().Add(-time.Minute).UnixNano())
	if status, _, _ := ask("nope"); status != 404 {
		t.Fatalf("d's list overdue: %d, want 404", status)
	}
	if d.ModelsPending(time.Now().UnixNano(), 10*time.Second) || !d.ModelsOverdue(time.Now().UnixNano(), 10*time.Second) {
		t.Fatal("pending/overdue disagree")
	}
	d.SetDown(true)
	d.State.UpAt.Store(time.Now().UnixNano())
	if d.ModelsPending(time.Now().UnixNano(), 10*time.Second) {
		t.Fatal("a down endpoint's list is not waited for")
	}
	// Without active health checks nothing holds a 404 back.
	s2 := mustServer(t, fmt.Sprintf(fourEndpoints, "round-robin"))
	defer s2.Close()
	if ctx := do(s2, `{"model":"sql","prompt":"x"}`); ctx.Response.StatusCode() != 404 {
		t.Fatalf("health.disable: %d, want 404", ctx.Response.StatusCode())
	}
}
