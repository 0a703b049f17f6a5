package bench

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/turnout/turnout/internal/config"
)

func TestParseFronts(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int
		err  string
	}{
		{"1,2,4", []int{1, 2, 4}, ""},
		{" 2 ", []int{2}, ""},
		{"4,1", []int{4, 1}, ""},
		{"1,,2", []int{1, 2}, ""},
		{"", nil, "want counts"},
		{"0", nil, "not a count"},
		{"17", nil, "not a count"},
		{"two", nil, "not a count"},
		{"1,2,4,1,2,4", []int{1, 2, 4, 1, 2, 4}, ""},
		{strings.Repeat("1,", 65), nil, "more than 64"},
	} {
		got, err := ParseFronts(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: err %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || len(got) != len(tc.want) {
			t.Errorf("%q: %v %v, want %v", tc.in, got, err, tc.want)
			continue
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("%q: %v, want %v", tc.in, got, tc.want)
			}
		}
	}
}

// The sync figures sum every front's page and divide by published
// decisions; other directions and results do not count.
func TestSyncPerDecision(t *testing.T) {
	page := func(bOut, mOut, pub int) string {
		return strings.Join([]string{
			`turnout_cluster_bytes_total{direction="out"} ` + strconv.Itoa(bOut),
			`turnout_cluster_bytes_total{direction="in"} 99999`,
			`turnout_cluster_messages_total{direction="out"} ` + strconv.Itoa(mOut),
			`turnout_cluster_messages_total{direction="in"} 99999`,
			`turnout_cluster_decisions_total{result="published"} ` + strconv.Itoa(pub),
			`turnout_cluster_decisions_total{result="dropped"} 77`,
		}, "\n")
	}
	b, m := SyncPerDecision([]string{page(3000, 10, 20), page(1000, 30, 20)})
	if b != 100 || m != 1 {
		t.Errorf("got %v B, %v msgs per decision; want 100, 1", b, m)
	}
	if b, m := SyncPerDecision([]string{"turnout_up 1"}); b != 0 || m != 0 {
		t.Errorf("no decisions: %v %v, want 0 0", b, m)
	}
}

// Each multi-front row is compared with the one-front row of its policy
// and trace (its round's), never another's.
func TestFrontsLines(t *testing.T) {
	rows := []Row{
		{Mode: "e2e", Trace: "mooncake", Policy: "prefix-affinity", Fronts: 1, HitRatio: 0.6, TTFT: Summary{P90: 100, P99: 200}},
		{Mode: "e2e", Trace: "mooncake", Policy: "prefix-affinity", Fronts: 2, HitRatio: 0.588, TTFT: Summary{P90: 110, P99: 190}, LoadReq: 1.04},
		{Mode: "e2e", Trace: "mooncake", Policy: "least-request", Fronts: 1, HitRatio: 0.3, TTFT: Summary{P90: 50, P99: 60}},
		{Mode: "e2e", Trace: "mooncake", Policy: "least-request", Fronts: 4, HitRatio: 0.3, TTFT: Summary{P90: 60, P99: 60}},
		{Mode: "e2e", Trace: "azure-conv", Policy: "prefix-affinity", Fronts: 2, HitRatio: 0.1, TTFT: Summary{P90: 10, P99: 20}},
		{Mode: "e2e", Trace: "mooncake", Policy: "haproxy-roundrobin"}, // a plain row
	}
	ls := FrontsLines(rows)
	if len(ls) != 5 {
		t.Fatalf("%d lines, want 5 (every multi-front row)", len(ls))
	}
	near := func(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }
	if l := ls[1]; l.Base != &rows[0] || !near(l.Hit(), 0.98) || !near(l.P90(), 1.1) || !near(l.P99(), 0.95) {
		t.Errorf("2 fronts: base %v hit %v p90 %v p99 %v", l.Base, l.Hit(), l.P90(), l.P99())
	}
	if l := ls[3]; l.Base != &rows[2] || !near(l.P90(), 1.2) {
		t.Errorf("least-request 4 fronts: base %v p90 %v", l.Base, l.P90())
	}
	if l := ls[4]; l.Base != nil || l.Hit() != 0 || l.P90() != 0 {
		t.Errorf("azure without a one-front row: base %v hit %v", l.Base, l.Hit())
	}
	// Rounds: the second round's rows pair with the second one-front row;
	// a row before any one-front row pairs with the first after it.
	rounds := []Row{
		{Trace: "t", Policy: "p", Fronts: 2, TTFT: Summary{P90: 30}},
		{Trace: "t", Policy: "p", Fronts: 1, TTFT: Summary{P90: 10}},
		{Trace: "t", Policy: "p", Fronts: 2, TTFT: Summary{P90: 11}},
		{Trace: "t", Policy: "p", Fronts: 1, TTFT: Summary{P90: 20}},
		{Trace: "t", Policy: "p", Fronts: 2, TTFT: Summary{P90: 22}},
	}
	rl := FrontsLines(rounds)
	if len(rl) != 5 || rl[0].Base != &rounds[1] || rl[1].Base != &rounds[1] || rl[2].Base != &rounds[1] ||
		rl[3].Base != &rounds[3] || rl[4].Base != &rounds[3] || !near(rl[4].P90(), 1.1) || !near(rl[0].P90(), 3) {
		t.Errorf("rounds paired wrongly: %+v", rl)
	}
	var b bytes.Buffer
	if err := WriteFrontsTable(&b, rows); err != nil {
		t.Fatal(err)
	}
	if out := b.String(); !strings.Contains(out, "0.980") || !strings.Contains(out, "1.100") || strings.Count(out, "\n") != 6 {
		t.Errorf("table:\n%s", out)
	}
	if got := rows[1].Label(); got != "prefix-affinity fronts=2" {
		t.Errorf("label %q", got)
	}
	if got := rows[5].Label(); got != "haproxy-roundrobin" {
		t.Errorf("plain label %q", got)
	}
}

// The generated config carries the cluster section turnout's loader reads.
func TestTurnoutConfigCluster(t *testing.T) {
	y := TurnoutConfig(ConfigOptions{
		Listen: "127.0.0.1:1", Model: "llama", Policy: PolicySpec{Policy: "prefix-affinity"},
		Endpoints:   []Endpoint{{Name: "r0", Address: "127.0.0.1:2"}},
		ClusterNATS: "nats://127.0.0.1:4222", ClusterName: "f2-1",
	})
	cfg, err := config.ParseConfig(y)
	if err != nil {
		t.Fatalf("%v\n%s", err, y)
	}
	if !cfg.Cluster.Enabled() || cfg.Cluster.NATS != "nats://127.0.0.1:4222" || cfg.Cluster.Name != "f2-1" {
		t.Errorf("cluster %+v from\n%s", cfg.Cluster, y)
	}
	if strings.Contains(string(TurnoutConfig(ConfigOptions{Listen: "127.0.0.1:1", Model: "llama", Policy: PolicySpec{Policy: "prefix-affinity"}})), "cluster") {
		t.Error("cluster section without ClusterNATS")
	}
}

// Drive with several URLs sends request i through URLs[i mod n].
func TestDriveFronts(t *testing.T) {
	var urls []string
	var st Stack
	for _, name := range []string{"r0", "r1", "r2"} {
		url := startTestMock(t, name)
		urls = append(urls, url)
		st.Mocks = append(st.Mocks, Endpoint{Name: name, Address: strings.TrimPrefix(url, "http://")})
	}
	reqs := SyntheticTrace(10, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := Drive(ctx, reqs, DriveOptions{URLs: urls, Model: "llama", Concurrency: 4, Compress: 1, TimeScale: 0.01})
	if err != nil {
		t.Fatal(err)
	}
	loads, err := st.ReplicaLoads(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// 10 requests over 3 fronts: 4, 3, 3.
	if res.Requests != 10 || loads[0].Requests != 4 || loads[1].Requests != 3 || loads[2].Requests != 3 {
		t.Errorf("requests %d, per URL %d/%d/%d; want 10: 4/3/3", res.Requests, loads[0].Requests, loads[1].Requests, loads[2].Requests)
	}
	for _, l := range loads {
		if l.TTFTCount != l.Requests || l.TTFTSeconds <= 0 {
			t.Errorf("replica %s: TTFT count %d sum %v for %d requests", l.Name, l.TTFTCount, l.TTFTSeconds, l.Requests)
		}
	}
}

// The engine TTFT is the replicas' pooled mean, in model time.
func TestMakeRowEngineTTFT(t *testing.T) {
	res := &RunResult{Requests: 4, Replicas: []ReplicaLoad{
		{Requests: 1, TTFTSeconds: 0.010, TTFTCount: 1},
		{Requests: 3, TTFTSeconds: 0.050, TTFTCount: 3},
	}}
	row := MakeRow("e2e", "t", PolicySpec{Policy: "p"}, res, 1, 1, 20)
	if d := row.EngineTTFT - 300; d > 1e-9 || d < -1e-9 { // 60 ms / 4 x 20
		t.Errorf("engine TTFT %v ms, want 300", row.EngineTTFT)
	}
}
