package bench

import (
	"bytes"
	"encoding/csv"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"strings"
	"testing"

	"github.com/turnout/turnout/internal/config"

	"github.com/turnout/turnout/route"
)

func sampleRows() []Row {
	return []Row{
		{Mode: "sim", Trace: "t", Policy: "round-robin", Requests: 10, HitRatio: 0.2, InfBound: 0.6, Pooled: 0.5, LoadReq: 1.0, LoadTok: 1.1, TTFT: Summary{P50: 5, P90: 9, P99: 12}, RPS: 3},
		{Mode: "sim", Trace: "t", Policy: "prefix-affinity:balance_abs=2", Requests: 10, HitRatio: 0.55, InfBound: 0.6, Pooled: 0.5, LoadReq: 1.3, LoadTok: 1.2, RPS: 3},
		{Mode: "sim", Trace: "t", Policy: "kv-aware", Note: "skipped: <needs events>"},
	}
}

func TestWriteCSV(t *testing.T) {
	var b bytes.Buffer
	if err := WriteCSV(&b, sampleRows()); err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(&b).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 4 || len(recs[0]) != len(rowHeader) {
		t.Fatalf("%d records of %d fields", len(recs), len(recs[0]))
	}
	col := map[string]int{}
	for i, h := range recs[0] {
		col[h] = i
	}
	if recs[2][col["policy"]] != "prefix-affinity:balance_abs=2" || recs[2][col["hit_ratio"]] != "0.5500" || recs[2][col["hit_vs_inf"]] != "0.9167" {
		t.Fatalf("row %v", recs[2])
	}
	if recs[3][col["note"]] != "skipped: <needs events>" {
		t.Fatalf("note %q", recs[3][col["note"]])
	}
}

func TestWriteTableAndMarkdown(t *testing.T) {
	var b bytes.Buffer
	if err := WriteTable(&b, sampleRows()); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(b.String()), "\n"); len(lines) != 4 || !strings.Contains(lines[2], "0.550") {
		t.Fatalf("table:\n%s", b.String())
	}
	b.Reset()
	if err := WriteMarkdown(&b, sampleRows()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "| prefix-affinity:balance_abs=2 | 10 | 0.550 |") {
		t.Fatalf("markdown:\n%s", b.String())
	}
}

func TestWriteSVG(t *testing.T) {
	var b bytes.Buffer
	sweep := []Row{{Policy: "prefix-affinity:capacity_blocks=16384", Requests: 5, HitRatio: 0.4, InfBound: 0.6, LoadReq: 1.05}}
	if err := WriteSVG(&b, sampleRows(), sweep, ChartOptions{Title: "a <b> & c", GoalImbalance: 1.1, GoalHitFraction: 0.85}); err != nil {
		t.Fatal(err)
	}
	// Well-formed XML, one dot per plotted row plus legend dots.
	dec := xml.NewDecoder(&b)
	circles, texts := 0, 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("svg is not well-formed: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			switch se.Name.Local {
			case "circle":
				circles++
			case "text":
				texts++
			}
		}
	}
	// 2 plotted rows (the skipped one is not drawn) x (dot + legend) + sweep dot + sweep legend.
	if circles != 6 {
		t.Fatalf("%d circles, want 6", circles)
	}
	if texts < 10 {
		t.Fatalf("only %d text elements", texts)
	}
}

func TestRowCheck(t *testing.T) {
	good := sampleRows()[1]
	if err := good.Check(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*Row){
		"no requests":    func(r *Row) { r.Requests = 0 },
		"errors":         func(r *Row) { r.Errors = 1 },
		"hit above 1":    func(r *Row) { r.HitRatio = 1.2 },
		"hit negative":   func(r *Row) { r.HitRatio = -0.1 },
		"hit NaN":        func(r *Row) { r.HitRatio = math.NaN() },
		"above bound":    func(r *Row) { r.HitRatio = 0.7 },
		"load below one": func(r *Row) { r.LoadReq = 0.5 },
	} {
		r := good
		mut(&r)
		if r.Check() == nil {
			t.Errorf("%s: passed", name)
		}
	}
	skipped := sampleRows()[2]
	if err := skipped.Check(); err != nil {
		t.Fatalf("skipped rows carry a note and pass: %v", err)
	}
}

func TestPolicySpecs(t *testing.T) {
	specs, err := ParsePolicySpecs("round-robin; prefix-affinity:balance_abs=2,capacity_blocks=1048576;haproxy-leastconn")
	if err != nil {
		t.Fatal(err)
	}
	if len(specs) != 3 || specs[1].String() != "prefix-affinity:balance_abs=2,capacity_blocks=1048576" || !specs[2].IsHAProxy() {
		t.Fatalf("specs %v", specs)
	}
	for _, bad := range []string{"", "Prefix", "prefix-affinity:x", "prefix-affinity:a=b}", "haproxy-roundrobin:a=1", "p:a=1\nb: 2"} {
		if _, err := ParsePolicySpecs(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	// The generated config is one the service accepts.
	cfg := TurnoutConfig(ConfigOptions{
		Listen: "127.0.0.1:9", Model: "llama", Policy: specs[1], DisableHealth: true, Syslog: "127.0.0.1:9514",
		Endpoints: []Endpoint{{Name: "r0", Address: "127.0.0.1:1"}, {Name: "r1", Address: "127.0.0.1:2"}},
	})
	c, err := config.ParseConfig(cfg)
	if err != nil {
		t.Fatalf("%v\n%s", err, cfg)
	}
	if len(c.Deployments[0].Pools[0].Endpoints) != 2 || c.Feedback.Syslog != "127.0.0.1:9514" {
		t.Fatalf("config %+v", c)
	}
	if _, err := route.New(c, route.Options{Seed: 1}); err != nil {
		t.Fatal(err)
	}
	def := DefaultPolicies()
	if len(def) < 6 || def[0].Policy != HAProxyRoundRobin {
		t.Fatalf("default policies %v", def)
	}
}

func TestDecisionDetail(t *testing.T) {
	text := `# HELP turnout_decisions_total x
turnout_decisions_total{deployment="bench",pool="bench_mixed",policy="kv-aware",outcome="balanced"} 7
turnout_decisions_total{deployment="bench",pool="bench_mixed",policy="kv-aware",outcome="affinity"} 30
turnout_decisions_total{deployment="bench",pool="bench_mixed",policy="kv-aware",outcome="overflow"} 0
turnout_kv_fallbacks_total{pool="bench_mixed"} 2
vllm:prefix_cache_hits_total{model_name="a,b"} 12.5
garbage line
`
	if got := DecisionDetail(text); got != "affinity=30 balanced=7 kv_fallbacks=2" {
		t.Fatalf("detail %q", got)
	}
	s := ParseProm(text)
	if v := SumProm(s, "vllm:prefix_cache_hits_total"); v != 12.5 {
		t.Fatalf("sum %v", v)
	}
	if s[4].Labels["model_name"] != "a,b" {
		t.Fatalf("labels %v", s[4].Labels)
	}
}
