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

// TestDeprecatedRefusalFamily: turnout_request_errors_total, kept one
// release, is turnout_refusals_total summed over status under the same
// reason names (not the former "unknown_model", "no_model", ...).
func TestDeprecatedRefusalFamily(t *testing.T) {
	d, err := New(mustConfig(t, `listen: 127.0.0.1:0
deployments:
  - name: llama
    models: [llama]
    pools: [{role: mixed, endpoints: [{name: a, address: 127.0.0.1:8001}]}]
`), Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := d.Refusals()
	r.NoteRefusal(404, "model_not_found", "x")
	r.NoteRefusal(404, "model_not_found", "x")
	r.NoteRefusal(413, contract.ReasonBodyTooLarge, "x")
	r.NoteRefusal(400, contract.ReasonBodyTooLarge, "x")
	var b strings.Builder
	d.ref.write(&b)
	for _, want := range []string{
		`turnout_request_errors_total{reason="model_not_found"} 2` + "\n",
		`turnout_request_errors_total{reason="body_too_large"} 2` + "\n",
		`turnout_request_errors_total{reason="other"} 0` + "\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("metrics lack %s:\n%s", want, b.String())
		}
	}
}
