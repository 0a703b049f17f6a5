package haproxy

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/turnout/turnout/internal/config"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

const goldenDir = "/etc/turnout/haproxy"

const multiYAML = `listen: 10.0.0.1:9090
session_headers: [x-session-id, x_conversation-id]
model_headers: [x-model]
max_body: 65536
fallbacks: 1
feedback: {syslog: 10.0.0.1:9514}
health: {path: /healthz, interval: 5s, fails: 3, timeout: 2s}
proxy:
  route_addrs: [10.0.0.1:9090, "[fd00::2]:9090"]
  fail_mode: closed
  route_timeout: 250ms
  breaker_failures: 5
  breaker_cooldown: 10s
haproxy: {listen: "0.0.0.0:80", maxconn: 10000, nbthread: 2}
deployments:
  - name: llama
    models: [meta-llama/Llama-3.1-8B-Instruct, "bad model name", "#comment"]
    pools:
      - role: mixed
        endpoints:
          - {name: llama-0, address: 10.0.1.1:8000}
          - {name: llama-1, address: "[fd00::11]:8000"}
  - name: qwen
    models: [Qwen/Qwen3-32B]
    pools:
      - role: prefill
        endpoints: [{name: qwen-p0, address: 10.0.2.1:8000}]
      - role: decode
        endpoints: [{name: qwen-d0, address: 10.0.2.2:8000}]
`

func mustParse(t testing.TB, y []byte) *config.Config {
	t.Helper()
	cfg, err := config.ParseConfig(y)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestRenderGolden(t *testing.T) {
	cases := []struct {
		name string
		yaml []byte
	}{
		{"default", config.DefaultConfigYAML},
		{"multi", []byte(multiYAML)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, err := Render(mustParse(t, tc.yaml), RenderOptions{Dir: goldenDir})
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range out.Files() {
				golden := filepath.Join("testdata", tc.name+"."+f.Name+".golden")
				if *update {
					if err := os.WriteFile(golden, f.Data, 0o644); err != nil {
						t.Fatal(err)
					}
					continue
				}
				want, err := os.ReadFile(golden)
				if err != nil {
					t.Fatalf("%v (run go test ./haproxy -run Golden -update)", err)
				}
				if !bytes.Equal(f.Data, want) {
					t.Errorf("%s differs from %s (run with -update after checking the diff):\n%s", f.Name, golden, f.Data)
				}
			}
		})
	}
}

// TestRenderPassesHAProxyCheck runs "haproxy -c" on every rendering.
func TestRenderPassesHAProxyCheck(t *testing.T) {
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		t.Skip("haproxy not installed; skipping haproxy -c")
	}
	r, err := NewRenderer(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, y := range [][]byte{config.DefaultConfigYAML, []byte(multiYAML)} {
		if err := r.Check(context.Background(), bin, mustParse(t, y), RenderOptions{}); err != nil {
			t.Error(err)
		}
	}
}

func TestRenderDetails(t *testing.T) {
	out, err := Render(mustParse(t, []byte(multiYAML)), RenderOptions{Dir: goldenDir})
	if err != nil {
		t.Fatal(err)
	}
	conf := string(out.Config)
	for _, want := range []string{
		"server route0 10.0.0.1:9090 check",
		"server route1 [fd00::2]:9090 check inter 1s fall 2 rise 1 on-marked-down shutdown-sessions backup",
		"server llama-1 [fd00::11]:8000 check inter 5000ms fall 3 rise 1",
		"use_backend %[req.body,json_query('$.model'),map_str(/etc/turnout/haproxy/models.map)]",
		"default_backend llama_mixed",
		// max_body 64 KiB + kv room (16 KiB + 4 KiB) + header room (16 KiB): qwen is PD.
		"tune.bufsize 102400",
		"retries 1\n",
	} {
		if !strings.Contains(conf, want) {
			t.Errorf("config lacks %q", want)
		}
	}
	if StructureOf(out.Config) != out.State.Structure || out.State.Structure == "" {
		t.Errorf("structure %q in file, %q in state", StructureOf(out.Config), out.State.Structure)
	}
	// Unsafe model names are left out of the map (they go to the default backend).
	if want := "meta-llama/Llama-3.1-8B-Instruct llama_mixed\nQwen/Qwen3-32B qwen_decode\n"; string(out.Map) != want {
		t.Errorf("map = %q, want %q", out.Map, want)
	}
	lua := string(out.Lua)
	for _, want := range []string{
		`{ "x_conversation-id", { "x-conversation-id", "x_conversation-id", "x-conversation_id", "x_conversation_id", } }`,
		`local FAIL_MODE_CLOSED = true`,
		`local ROUTE_DST = "unix@/etc/turnout/haproxy/route.sock"`,
		`local FALLBACK_VARS = { "txn.turnout.fb1", }`,
		`local BODY_ROOM = 86016`,
		`  ["prefill_failed"] = "relay",`,
		`{ "authorization", { "authorization", } },`, // turnout forwards it to the prefill
	} {
		if !strings.Contains(lua, want) {
			t.Errorf("lua lacks %q", want)
		}
	}

	// Membership changes keep the structure; settings changes do not.
	cfg := mustParse(t, []byte(multiYAML))
	cfg.Deployments[0].Pools[0].Endpoints = cfg.Deployments[0].Pools[0].Endpoints[:1]
	out2, err := Render(cfg, RenderOptions{Dir: goldenDir})
	if err != nil {
		t.Fatal(err)
	}
	if out2.State.Structure != out.State.Structure {
		t.Error("removing an endpoint changed the structure hash")
	}
	cfg.Proxy.RouteTimeout = config.Duration(1)
	out3, _ := Render(cfg, RenderOptions{Dir: goldenDir})
	if out3.State.Structure == out.State.Structure {
		t.Error("changing the route timeout kept the structure hash")
	}
}

// TestRenderPD: only a PD decode backend runs the kv filter, the prefill
// backend is never chosen by a rule, and a config without PD keeps the
// plain buffer size and does not send credentials to turnout.
func TestRenderPD(t *testing.T) {
	out, err := Render(mustParse(t, []byte(multiYAML)), RenderOptions{Dir: goldenDir})
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]string{}
	for _, sec := range strings.Split(string(out.Config), "\nbackend ")[1:] {
		name, body, _ := strings.Cut(sec, "\n")
		sections[name] = body
	}
	for name, want := range map[string]struct{ filter, useServer bool }{
		"llama_mixed":  {false, true},
		"qwen_prefill": {false, false},
		"qwen_decode":  {true, true},
	} {
		body, ok := sections[name]
		if !ok {
			t.Fatalf("no backend %s", name)
		}
		if got := strings.Contains(body, "filter lua.turnout_kv\n"); got != want.filter {
			t.Errorf("backend %s: filter %v, want %v", name, got, want.filter)
		}
		if got := strings.Contains(body, "use-server "); got != want.useServer {
			t.Errorf("backend %s: use-server rules %v, want %v", name, got, want.useServer)
		}
	}
	if got := strings.Count(string(out.Config), "filter lua.turnout_kv"); got != 1 {
		t.Errorf("%d filter lines, want 1", got)
	}
	// The prefill pool is synced like any other.
	if srvs := out.State.Backends["qwen_prefill"]; len(srvs) != 1 || srvs[0].Name != "qwen-p0" {
		t.Errorf("prefill backend state = %v", srvs)
	}

	plain, err := Render(mustParse(t, config.DefaultConfigYAML), RenderOptions{Dir: goldenDir})
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"filter lua.turnout_kv", "kv_transfer_params a decode body gains"} {
		if strings.Contains(string(plain.Config), bad) {
			t.Errorf("non-PD config contains %q", bad)
		}
	}
	if strings.Contains(string(plain.Lua), `"authorization"`) {
		t.Error("non-PD Lua sends Authorization to turnout")
	}
}

// hostileConfig builds a config around one untrusted string, bypassing
// route's validation, as a buggy caller or a future config field might.
func hostileConfig(s string, where int) *config.Config {
	cfg, _ := config.ParseConfig(config.DefaultConfigYAML)
	switch where % 8 {
	case 0:
		cfg.Deployments[0].Name = s
	case 1:
		cfg.Deployments[0].Pools[0].Endpoints[0].Name = s
	case 2:
		cfg.Deployments[0].Pools[0].Endpoints[0].Address = s
	case 3:
		cfg.Deployments[0].Models = append(cfg.Deployments[0].Models, s)
		cfg.Deployments = append(cfg.Deployments, config.DeploymentConfig{Name: "x", Models: []string{s + "2"},
			Pools: []config.PoolConfig{{Role: config.RoleMixed}}})
	case 4:
		cfg.SessionHeaders = []string{s}
	case 5:
		cfg.HAProxy.Listen = s
	case 6:
		cfg.Health.Path = s
	case 7:
		cfg.Proxy.RouteAddrs = []string{s}
	}
	return cfg
}

// FuzzRender feeds hostile names to the renderer: it must either refuse or
// produce files where the name stays one token (no new line, no quote
// break-out in the Lua) and, when the haproxy binary exists, pass haproxy -c.
func FuzzRender(f *testing.F) {
	for _, s := range []string{
		"ok-name", "evil\n    server x 1.2.3.4:80", "a b", "x#y", `q"uote`, `lua"]]..os.exit()--`,
		"127.0.0.1:80\nbind :81", "/p\nhttp-request deny", "m\nllama x_mixed", "{x}", "a;b", "\x00", "ünï",
		"%[req.hdr(host)]", "[::1]:9090",
	} {
		for w := range 8 {
			f.Add(s, w)
		}
	}
	bin, _ := exec.LookPath("haproxy")
	r, err := NewRenderer(nil)
	if err != nil {
		f.Fatal(err)
	}
	checked := map[string]bool{}
	f.Fuzz(func(t *testing.T, s string, where int) {
		if where < 0 {
			where = -where
		}
		cfg := hostileConfig(s, where)
		out, err := r.Render(cfg, RenderOptions{Dir: "/tmp/turnout-fuzz"})
		if err != nil {
			if !errors.Is(err, ErrRender) {
				t.Fatalf("error without ErrRender: %v", err)
			}
			return
		}
		// A value must not add lines: compare with the same config holding a
		// harmless value in the same place.
		safe := []string{"safe-x", "safe-x", "127.0.0.1:1", "safe-x", "safe-x", "127.0.0.1:1", "/x", "127.0.0.1:1"}[where%8]
		ref, err := r.Render(hostileConfig(safe, where), RenderOptions{Dir: "/tmp/turnout-fuzz"})
		if err != nil {
			t.Fatalf("reference render: %v", err)
		}
		if a, b := bytes.Count(out.Config, []byte{'\n'}), bytes.Count(ref.Config, []byte{'\n'}); a != b {
			t.Fatalf("value %q changed haproxy.cfg from %d to %d lines", s, b, a)
		}
		if a, b := bytes.Count(out.Lua, []byte{'\n'}), bytes.Count(ref.Lua, []byte{'\n'}); a != b {
			t.Fatalf("value %q changed the Lua from %d to %d lines", s, b, a)
		}
		for _, line := range strings.Split(string(out.Map), "\n") {
			if line != "" && len(strings.Fields(line)) != 2 {
				t.Fatalf("map line %q is not key value", line)
			}
		}
		// haproxy -c is slow: run it once per distinct accepted shape.
		key := strings.Map(func(r rune) rune {
			if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
				return 'a'
			}
			return r
		}, s)
		if bin == "" || checked[key] || len(checked) > 40 {
			return
		}
		checked[key] = true
		if err := r.Check(context.Background(), bin, cfg, RenderOptions{}); err != nil {
			t.Fatalf("rendered config for %q fails haproxy -c: %v", s, err)
		}
	})
}

// renderDefaultWith renders the default config after edit.
func renderDefaultWith(t *testing.T, edit func(*config.Config)) string {
	t.Helper()
	cfg, err := config.ParseConfig(config.DefaultConfigYAML)
	if err != nil {
		t.Fatal(err)
	}
	edit(cfg)
	out, err := Render(cfg, RenderOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	return string(out.Config)
}

// The default render retries refused connections only (no copy of each
// request); haproxy.l7_retries: true adds empty responses and 503s. Neither
// retries a response timeout (a slow stream: re-sending it would run the
// generation twice).
func TestRenderL7Retries(t *testing.T) {
	for _, tc := range []struct {
		set, want bool
	}{{false, false}, {true, true}} {
		out := renderDefaultWith(t, func(c *config.Config) { c.HAProxy.L7Retries = tc.set })
		got := strings.Contains(out, "\n    retry-on conn-failure empty-response 503\n")
		connOnly := strings.Contains(out, "\n    retry-on conn-failure\n")
		if got != tc.want || connOnly == tc.want || strings.Contains(out, "response-timeout") {
			t.Fatalf("l7_retries=%v: retry-on rendered=%v\n%s", tc.set, got, out)
		}
	}
}

// haproxy.feedback: udp (the default) logs a datagram per request to
// feedback.syslog; ring logs into a ring forwarded there over TCP,
// octet-counted.
func TestRenderFeedbackRing(t *testing.T) {
	for _, tc := range []struct {
		mode       string
		want, lose []string
	}{
		{config.HAProxyFeedbackUDP, []string{"\n    log 127.0.0.1:9514 local0 info\n"}, []string{"ring@", "\nring "}},
		{config.HAProxyFeedbackRing, []string{"\n    log ring@turnout_feedback local0 info\n", "\nring turnout_feedback\n",
			"\n    server turnout 127.0.0.1:9514 log-proto octet-count\n"}, []string{"\n    log 127.0.0.1:9514"}},
	} {
		out := renderDefaultWith(t, func(c *config.Config) { c.HAProxy.Feedback = tc.mode })
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: %q not rendered", tc.mode, w)
			}
		}
		for _, l := range tc.lose {
			if strings.Contains(out, l) {
				t.Errorf("%s: %q rendered", tc.mode, l)
			}
		}
	}
}

// haproxy.spoe renders the SPOE path: the engine file, the agent backend and
// no Lua action; the result passes haproxy -c.
func TestRenderSPOE(t *testing.T) {
	cfg, err := config.ParseConfig(config.DefaultConfigYAML)
	if err != nil {
		t.Fatal(err)
	}
	cfg.HAProxy.SPOE = "127.0.0.1:9091"
	dir := t.TempDir()
	out, err := Render(cfg, RenderOptions{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	conf := string(out.Config)
	for _, want := range []string{"filter spoe engine turnout config " + filepath.Join(dir, SPOEFile), "backend turnout_spoe", "server agent0 127.0.0.1:9091"} {
		if !strings.Contains(conf, want) {
			t.Fatalf("config lacks %q", want)
		}
	}
	if strings.Contains(conf, "http-request lua.turnout_route") || strings.Contains(conf, "listen turnout_route") {
		t.Fatal("SPOE config still calls the Lua action")
	}
	if len(out.SPOE) == 0 || !strings.Contains(string(out.SPOE), "spoe-message turnout-route") {
		t.Fatalf("spoe conf: %s", out.SPOE)
	}
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		t.Skip("haproxy not installed: skipping haproxy -c")
	}
	if err := writeFiles(dir, out.Files()); err != nil {
		t.Fatal(err)
	}
	if err := CheckFile(context.Background(), bin, filepath.Join(dir, ConfigFile)); err != nil {
		t.Fatal(err)
	}
}

// renderedBufSize reads tune.bufsize from a rendered haproxy.cfg.
func renderedBufSize(t *testing.T, conf []byte) int {
	t.Helper()
	m := regexp.MustCompile(`(?m)^\s*tune\.bufsize (\d+)$`).FindSubmatch(conf)
	if m == nil {
		t.Fatal("no tune.bufsize in the rendered config")
	}
	n, err := strconv.Atoi(string(m[1]))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestRenderBufSize pins what tune.bufsize costs: without a prefill/decode
// deployment it stays at or below 64 KiB whatever max_body is (turnout
// routes on a route_body prefix; buffers above 64 KiB halve HAProxy's
// throughput on every frontend), on both paths; only a PD deployment gets
// a buffer that holds a whole max_body body plus its kv_transfer_params.
func TestRenderBufSize(t *testing.T) {
	base := string(config.DefaultConfigYAML)
	cases := []struct {
		name     string
		yaml     string
		want     int  // exact tune.bufsize, 0 = only the bound
		atMost64 bool // <= 64 KiB
	}{
		{"default (SPOE, max_body 256 KiB)", base, 64 << 10, true},
		{"Lua path", base + "\nproxy: {route_addrs: [127.0.0.1:9090]}\n", 64 << 10, true},
		{"max_body 64 MiB", strings.Replace(base, "max_body: 262144", "max_body: 67108864", 1), 64 << 10, true},
		{"route_body 16 KiB", strings.Replace(base, "max_body: 262144", "max_body: 262144\nroute_body: 16384", 1), 32 << 10, true},
		{"max_body below the default prefix", strings.Replace(base, "max_body: 262144", "max_body: 8192", 1), 24 << 10, true},
		{"route_body chosen above 64 KiB", strings.Replace(base, "max_body: 262144", "max_body: 262144\nroute_body: 131072", 1), 144 << 10, false},
		{"prefill/decode", multiYAML, bufSize(65536 + kvRoom(65536)), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := mustParse(t, []byte(tc.yaml))
			out, err := Render(cfg, RenderOptions{Dir: goldenDir})
			if err != nil {
				t.Fatal(err)
			}
			got := renderedBufSize(t, out.Config)
			if tc.want != 0 && got != tc.want {
				t.Errorf("tune.bufsize %d, want %d", got, tc.want)
			}
			if tc.atMost64 && got > 64<<10 {
				t.Errorf("tune.bufsize %d above 64 KiB without a prefill/decode deployment", got)
			}
			if pd := strings.Contains(tc.yaml, "role: prefill"); pd && got < cfg.MaxBody+kvRoom(cfg.MaxBody) {
				t.Errorf("PD: tune.bufsize %d cannot hold a max_body body with its kv_transfer_params", got)
			}
		})
	}
	// route_body is validated against max_body.
	for _, bad := range []string{"route_body: 512", "route_body: 300000"} {
		if _, err := config.ParseConfig([]byte(strings.Replace(base, "max_body: 262144", "max_body: 262144\n"+bad, 1))); err == nil || !strings.Contains(err.Error(), "route_body") {
			t.Errorf("%s: err %v, want a route_body error", bad, err)
		}
	}
}

// The renderer and turnout serve agree on the agent's address: the default
// is a unix socket next to the files; an explicit haproxy.spoe wins; the Lua
// path needs none; a socket path too long to bind is refused at render.
func TestSPOEAddr(t *testing.T) {
	cfg := mustParse(t, config.DefaultConfigYAML)
	if got := SPOEAddr(cfg, "/etc/turnout/haproxy"); got != "unix@/etc/turnout/haproxy/spoe.sock" {
		t.Errorf("default: %q", got)
	}
	if got := SPOEAddr(cfg, ""); got != "" {
		t.Errorf("no directory: %q", got)
	}
	out, err := Render(cfg, RenderOptions{Dir: goldenDir})
	if err != nil || !strings.Contains(string(out.Config), "server agent0 unix@"+goldenDir+"/spoe.sock ") {
		t.Errorf("render: %v\n%s", err, out.Config)
	}
	cfg.HAProxy.SPOE = "127.0.0.1:9091"
	if got := SPOEAddr(cfg, "/d"); got != "127.0.0.1:9091" {
		t.Errorf("explicit: %q", got)
	}
	cfg.HAProxy.SPOE, cfg.HAProxy.Path = "", config.HAProxyPathLua
	if got := SPOEAddr(cfg, "/d"); got != "" {
		t.Errorf("lua: %q", got)
	}
	cfg.HAProxy.Path = config.HAProxyPathSPOE
	long := "/" + strings.Repeat("d", 100)
	if _, err := Render(cfg, RenderOptions{Dir: long}); err == nil || !strings.Contains(err.Error(), "haproxy.spoe") {
		t.Errorf("long socket path: %v", err)
	}
}
