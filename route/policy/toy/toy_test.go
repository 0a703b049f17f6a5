package toy_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/fleet"
	"github.com/turnout/turnout/route/internal/routetest"
	"github.com/turnout/turnout/route/policy"
	"github.com/turnout/turnout/route/policy/toy"
)

// The toy policy, registered by one line, routes through the whole
// decision pipeline: to the replica with the fewest waiting requests, its
// note in the decision's record and log line.
func TestToyRoutes(t *testing.T) {
	reg := policy.DefaultRegistry()
	reg.Policy(toy.Type, toy.NewFactory()) // the one registration line
	s, err := route.New(routetest.MustConfig(t, `
health: {disable: true}
deployments:
  - name: llama
    models: [llama]
    policy: {name: toy-fewest-waiting}
    pools:
      - role: mixed
        endpoints:
          - {name: a, address: 127.0.0.1:8001}
          - {name: b, address: 127.0.0.1:8002}
          - {name: c, address: 127.0.0.1:8003}
`), route.Options{Registry: reg, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	eps := s.Snapshot().Deployments[0].Serve.Endpoints
	scrape := func(waiting ...int64) {
		for i, e := range eps {
			e.SetEngineLoad(&fleet.EngineLoad{Requests: waiting[i] + 2, Waiting: waiting[i], KVUsage: -1, Mark: e.DecisionMark(), PeerMark: e.PeerMark()})
		}
	}
	decide := func(wantServer string, wantNote float64) {
		t.Helper()
		var v contract.Verdict
		s.Decide(&contract.Input{Body: []byte(`{"model":"llama","prompt":"hi"}`)}, &v)
		if v.Status != 200 || string(v.Server) != wantServer {
			t.Fatalf("routed %d to %q, want 200 to %q", v.Status, v.Server, wantServer)
		}
		var r route.DecisionRecord
		if !s.Ledger().LookupDecision(v.Decision, time.Now(), &r) {
			t.Fatal("decision not in the ledger")
		}
		if got, ok := r.Notes.Get("toy_waiting"); !ok || got != wantNote {
			t.Fatalf("note toy_waiting %v (%v), want %v", got, ok, wantNote)
		}
		var line bytes.Buffer
		zl := zerolog.New(&line)
		r.Fields(zl.Log()).Send()
		if want := []byte(`"toy_waiting":`); !bytes.Contains(line.Bytes(), want) {
			t.Fatalf("log line %s lacks %s", line.Bytes(), want)
		}
	}
	scrape(5, 0, 3)
	decide("b", 0)
	scrape(5, 9, 3)
	decide("c", 3)
}

// A policy the registry does not know is refused at load, naming the known
// ones: without its registration line the toy does not exist.
func TestToyUnregistered(t *testing.T) {
	_, err := route.New(routetest.MustConfig(t, `
health: {disable: true}
deployments:
  - name: llama
    models: [llama]
    policy: {name: toy-fewest-waiting}
    pools: [{role: mixed, endpoints: [{name: a, address: 127.0.0.1:8001}]}]
`), route.Options{Registry: policy.DefaultRegistry()})
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte("least-request")) {
		t.Fatalf("err %v: want an unknown policy naming the registered ones", err)
	}
}

// docs/policies.md shows the toy's registration line as this test has it.
func TestToyDocLine(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "policies.md"))
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("toy_test.go")
	if err != nil {
		t.Fatal(err)
	}
	const line = "\treg.Policy(toy.Type, toy.NewFactory()) // the one registration line\n"
	if !bytes.Contains(doc, []byte(line)) || !bytes.Contains(src, []byte(line)) {
		t.Fatalf("docs/policies.md and toy_test.go disagree on the registration line %q", line)
	}
}
