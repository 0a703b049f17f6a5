//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/turnout/turnout/lab/mock"
	"github.com/turnout/turnout/lab/testenv/kubetest"
	"github.com/turnout/turnout/lab/testenv/natstest"
	"github.com/turnout/turnout/route/kv"
)

// The dashboard and the alert rules as shipped in the chart.
var (
	dashboardFile = filepath.Join("..", "deploy", "helm", "turnout", "files", "turnout-dashboard.json")
	alertsFile    = filepath.Join("..", "deploy", "helm", "turnout", "files", "turnout-alerts.yaml")
)

// TestDashboardAndAlertsOnPrometheus runs a real Prometheus scraping a
// turnout (admin listener) that routes demo traffic through HAProxy to mock
// replicas, with every feature the dashboard shows on: prefix affinity,
// kv-aware with KV events, engine scrapes, cluster sync over NATS and
// Kubernetes discovery. Every dashboard query must return data, every alert
// expression must evaluate (rule health ok), and every metric either names
// must be one turnout exports.
func TestDashboardAndAlertsOnPrometheus(t *testing.T) {
	promBin, err := exec.LookPath("prometheus")
	if err != nil {
		kubetest.Skip(t, "prometheus not installed (apt-get install prometheus; .ci/run does)")
	}
	NeedHAProxy(t)
	c := kubetest.Start(t, repoRoot(), "prom", "")
	ctx := context.Background()
	// One discovered endpoint on a TEST-NET address: discovery lists and
	// counts a change; the endpoint itself stays down.
	if _, err := c.Admin.DiscoveryV1().EndpointSlices("prom").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "vllm-a", Labels: map[string]string{discoveryv1.LabelServiceName: "vllm"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptrTo("http"), Port: ptrTo(int32(8000))}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"192.0.2.10"}, Conditions: discoveryv1.EndpointConditions{Ready: ptrTo(true)}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	nats := natstest.Start(t, FreePort(t))

	llama := []*Mock{StartMock(t, "m0", nil), StartMock(t, "m1", nil)}
	l := zerolog.Nop()
	pctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	pub, err := kv.NewPublisherWithConfig(pctx, kv.PublisherConfig{Addr: fmt.Sprintf("tcp://127.0.0.1:%d", FreePort(t))}, &l)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	k0 := StartMock(t, "k0", func(c *mock.Config) { c.BlockSize = 4; c.KVEvents = pub; c.Models = []string{"kvmodel"} })

	dir := t.TempDir()
	turnoutAddr, adminAddr, haAddr := FreeAddr(t), FreeAddr(t), FreeAddr(t)
	cfg := fmt.Sprintf(`listen: %s
admin_listen: %s
feedback: {syslog: %s}
health: {interval: 1s, timeout: 500ms}
engine_metrics: {interval: 1s}
cluster: {nats: %q, name: prom-e2e}
haproxy: {listen: %s, dir: %s}
deployments:
  - name: llama
    models: [llama]
    policy: {name: prefix-affinity}
    pools: [{role: mixed, endpoints: [{name: m0, address: %s}, {name: m1, address: %s}]}]
  - name: kv
    models: [kvmodel]
    policy: {name: kv-aware, params: {block_size: 4, tokenizer: {mode: remote, timeout: 500ms}}}
    pools: [{role: mixed, endpoints: [{name: k0, address: %s, kv_events: %q}]}]
  - name: fleet
    models: [fleet]
    pools: [{role: mixed, discovery: {kubernetes: {namespace: prom, service: vllm, port: http}}}]
`, turnoutAddr, adminAddr, FreeUDPAddr(t), nats.URL, haAddr, dir, llama[0].Addr, llama[1].Addr, k0.Addr, pub.Addr())
	StartTurnout(t, turnoutAddr, cfg, "--haproxy-dir", dir, "--kubeconfig", c.Kubeconfig(kubetest.TurnoutToken))
	admin := "http://" + adminAddr
	WaitHTTP(t, admin+"/healthz", 10*time.Second)
	// The admin listener never serves the route API.
	if r, err := Post(ctx, http.DefaultClient, admin+"/internal/route", []byte(`{"model":"llama"}`), nil); err != nil || r.Status != http.StatusNotFound {
		t.Fatalf("admin_listen must refuse /internal/route with 404, got %v %+v", err, r)
	}
	h := StartRenderedHAProxy(t, dir, haAddr)
	h.WaitServersUp(t, "llama_mixed/m0", "llama_mixed/m1", "kv_mixed/k0")

	promDir := t.TempDir()
	promAddr := FreeAddr(t)
	alertsAbs, _ := filepath.Abs(alertsFile)
	promCfg := fmt.Sprintf(`global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: [%q]
scrape_configs:
  - job_name: turnout
    static_configs: [{targets: [%q]}]
`, alertsAbs, adminAddr)
	if err := os.WriteFile(filepath.Join(promDir, "prometheus.yml"), []byte(promCfg), 0o644); err != nil {
		t.Fatal(err)
	}
	StartProc(t, "prometheus", promBin, "--config.file", filepath.Join(promDir, "prometheus.yml"),
		"--storage.tsdb.path", filepath.Join(promDir, "data"), "--web.listen-address", promAddr)
	prom := "http://" + promAddr
	WaitHTTP(t, prom+"/-/ready", 30*time.Second)

	// Demo traffic through HAProxy for 8 s: completions carry TTFB and
	// status back to turnout (feedback), prompts repeat (prefix hits).
	client := &http.Client{Timeout: 10 * time.Second}
	deadline := time.Now().Add(8 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		for _, model := range []string{"llama", "kvmodel"} {
			body := fmt.Sprintf(`{"model":%q,"max_tokens":4,"messages":[{"role":"user","content":"tell me about turnouts, part %d"}]}`, model, i%3)
			r, err := Post(ctx, client, h.URL+"/v1/chat/completions", []byte(body), nil)
			if err != nil || r.Status != http.StatusOK {
				t.Fatalf("request %d (%s): %v %+v", i, model, err, r)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(3 * time.Second) // a few more scrapes and rule evaluations

	exported := exportedNames(t, admin+"/metrics")
	queries := dashboardQueries(t)
	rules := alertExprs(t)
	if len(queries) < 15 || len(rules) < 6 {
		t.Fatalf("found %d dashboard queries and %d alert rules: the files did not parse as expected", len(queries), len(rules))
	}
	for _, q := range append(append([]string(nil), queries...), rules...) {
		if err := namesExported(q, exported); err != nil {
			t.Error(err)
		}
	}
	for _, q := range queries {
		n, err := promQuery(prom, q)
		switch {
		case err != nil:
			t.Errorf("dashboard query %s: %v", q, err)
		case n == 0:
			t.Errorf("dashboard query returns nothing: %s", q)
		}
	}
	for _, q := range rules {
		if _, err := promQuery(prom, q); err != nil {
			t.Errorf("alert expression %s: %v", q, err)
		}
	}
	// Prometheus evaluated every rule without error.
	health := ruleHealth(t, prom)
	for name, h := range health {
		if h != "ok" {
			t.Errorf("alert %s: rule health %q", name, h)
		}
	}
	if len(health) != len(rules) {
		t.Errorf("Prometheus loaded %d rules, the file has %d", len(health), len(rules))
	}
	// The check fails on a metric turnout does not export.
	if err := namesExported(`rate(turnout_no_such_metric_total[1m])`, exported); err == nil {
		t.Error("a query naming an unknown metric must fail the check")
	}
}

func ptrTo[T any](v T) *T { return &v }

var metricName = regexp.MustCompile(`\bturnout_[a-z0-9_]+`)

// namesExported fails a query naming a turnout_* metric that is not exported.
func namesExported(q string, exported map[string]bool) error {
	var missing []string
	for _, n := range metricName.FindAllString(q, -1) {
		if !exported[n] {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("query names metrics turnout does not export (%s): %s", strings.Join(missing, ", "), q)
	}
	return nil
}

// exportedNames is the set of sample names on a /metrics page.
func exportedNames(t *testing.T, u string) map[string]bool {
	t.Helper()
	res, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	names := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names[line[:i]] = true
		}
	}
	if !names["turnout_decisions_total"] {
		t.Fatalf("no turnout_decisions_total on %s", u)
	}
	return names
}

// dashboardQueries returns every panel query with Grafana's variables set
// as "All" would set them.
func dashboardQueries(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	r := strings.NewReplacer("$deployment", ".*", "$__rate_interval", "30s")
	var qs []string
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			if tg.Expr != "" {
				qs = append(qs, r.Replace(tg.Expr))
			}
		}
	}
	return qs
}

// alertExprs returns every alert expression of the rule file.
func alertExprs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
				Expr  string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", alertsFile, err)
	}
	var qs []string
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			qs = append(qs, r.Expr)
		}
	}
	return qs
}

// promQuery runs an instant query and returns the number of series in its result.
func promQuery(prom, q string) (int, error) {
	res, err := http.Get(prom + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	var out struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(res.Body).Decode(&out); err != nil {
		return 0, fmt.Errorf("decode: %w", err)
	}
	if out.Status != "success" {
		return 0, fmt.Errorf("prometheus: %s", out.Error)
	}
	return len(out.Data.Result), nil
}

// ruleHealth maps each loaded alert to Prometheus's evaluation health.
func ruleHealth(t *testing.T, prom string) map[string]string {
	t.Helper()
	var out struct {
		Data struct {
			Groups []struct {
				Rules []struct {
					Name      string `json:"name"`
					Health    string `json:"health"`
					LastError string `json:"lastError"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	res, err := http.Get(prom + "/api/v1/rules")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if err := json.NewDecoder(res.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	h := map[string]string{}
	var names []string
	for _, g := range out.Data.Groups {
		for _, r := range g.Rules {
			h[r.Name] = r.Health + strings.TrimSpace(" "+r.LastError)
			names = append(names, r.Name)
		}
	}
	sort.Strings(names)
	t.Logf("rules evaluated: %v", names)
	return h
}

// TestDashboardFromStart: a fresh turnout with the features off (one
// deployment of one configured replica, round-robin: no prefix or kv-aware
// policy, no cluster, no discovery, no traffic) exports every metric the dashboard and the alerts read, and a
// real Prometheus scraping it gets a series for every dashboard query
// (0 or NaN, not "No data"). No alert fires on such a turnout.
func TestDashboardFromStart(t *testing.T) {
	turnoutAddr, adminAddr := FreeAddr(t), FreeAddr(t)
	cfg := fmt.Sprintf(`listen: %s
admin_listen: %s
deployments:
  - name: llama
    models: [llama]
    policy: {name: round-robin}
    pools: [{role: mixed, endpoints: [{name: m0, address: %s}]}]
`, turnoutAddr, adminAddr, StartMock(t, "m0", nil).Addr)
	StartTurnout(t, turnoutAddr, cfg)
	admin := "http://" + adminAddr
	WaitHTTP(t, admin+"/healthz", 10*time.Second)

	exported := exportedNames(t, admin+"/metrics")
	queries := dashboardQueries(t)
	rules := alertExprs(t)
	if len(queries) < 15 || len(rules) < 6 {
		t.Fatalf("found %d dashboard queries and %d alert rules: the files did not parse as expected", len(queries), len(rules))
	}
	for _, q := range append(append([]string(nil), queries...), rules...) {
		if err := namesExported(q, exported); err != nil {
			t.Error(err)
		}
	}

	// The names check above needs no Prometheus; the queries do.
	promBin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("prometheus not installed (apt-get install prometheus; .ci/run does): checked the names only")
	}
	promDir := t.TempDir()
	promAddr := FreeAddr(t)
	alertsAbs, _ := filepath.Abs(alertsFile)
	promCfg := fmt.Sprintf(`global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: [%q]
scrape_configs:
  - job_name: turnout
    static_configs: [{targets: [%q]}]
`, alertsAbs, adminAddr)
	if err := os.WriteFile(filepath.Join(promDir, "prometheus.yml"), []byte(promCfg), 0o644); err != nil {
		t.Fatal(err)
	}
	StartProc(t, "prometheus", promBin, "--config.file", filepath.Join(promDir, "prometheus.yml"),
		"--storage.tsdb.path", filepath.Join(promDir, "data"), "--web.listen-address", promAddr)
	prom := "http://" + promAddr
	WaitHTTP(t, prom+"/-/ready", 60*time.Second)
	// rate() and increase() need two scrapes in their window: wait until
	// every query answers, or name the ones that never did.
	var empty []string
	deadline := time.Now().Add(60 * time.Second)
	for {
		empty = empty[:0]
		for _, q := range queries {
			if n, err := promQuery(prom, q); err != nil || n == 0 {
				empty = append(empty, fmt.Sprintf("%s (%v)", q, err))
			}
		}
		if len(empty) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	for _, q := range empty {
		t.Errorf("dashboard query returns nothing on a fresh turnout: %s", q)
	}
	// Nothing is wrong with this turnout: no alert fires (a metric exported
	// at 0 must not read as trouble, e.g. discovery synced without discovery).
	for _, q := range rules {
		n, err := promQuery(prom, q)
		if err != nil {
			t.Errorf("alert expression %s: %v", q, err)
		} else if n > 0 {
			t.Errorf("alert fires on a fresh turnout: %s", q)
		}
	}
}
