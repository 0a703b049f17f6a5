package route

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/route/contract"
)

// Refusals are logged at most once per refusalLogEvery, the next line
// saying how many were not logged, and counted all.
func TestRefusalsLoggedRateLimited(t *testing.T) {
	var logs bytes.Buffer
	l := zerolog.New(&logs)
	d, err := New(mustConfig(t, fmt.Sprintf(fourEndpoints, "round-robin")), Options{Log: &l})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		d.Refusals().NoteRefusal(503, contract.ReasonOverloaded, "x")
	}
	d.Refusals().NoteRefusal(200, "ok", "not a refusal")
	if n := strings.Count(logs.String(), "request refused by turnout"); n != 1 {
		t.Fatalf("%d log lines for 5 refusals within %v, want 1:\n%s", n, refusalLogEvery, logs.String())
	}
	d.ref.lastLog.Store(0) // the interval passed
	d.Refusals().NoteRefusal(503, contract.ReasonOverloaded, "x")
	if !strings.Contains(logs.String(), `"not_logged_since_last":4`) {
		t.Fatalf("the next line does not count the 4 unlogged:\n%s", logs.String())
	}
	var b strings.Builder
	d.ref.write(&b)
	if !strings.Contains(b.String(), `turnout_refusals_total{status="503",reason="overloaded"} 6`+"\n") {
		t.Fatalf("metrics:\n%s", b.String())
	}
}
