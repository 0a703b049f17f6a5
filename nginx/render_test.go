package nginx

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/contract"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

const goldenDir = "/etc/turnout/nginx"

// multiYAML mixes both modes, prefill/decode, two turnout addresses, two
// model headers and model names nginx's map syntax would misread.
const multiYAML = `listen: 10.0.0.1:9090
session_headers: [x-session-id, x_conversation-id]
model_headers: [x-model, X-Model-Name]
max_body: 65536
feedback: {syslog: 10.0.0.1:9514}
proxy:
  route_addrs: [10.0.0.1:9090, "[fd00::2]:9090"]
  fail_mode: closed
  route_timeout: 250ms
  breaker_failures: 5
  breaker_cooldown: 10s
nginx: {listen: "0.0.0.0:80", mode: header}
deployments:
  - name: llama
    models: [meta-llama/Llama-3.1-8B-Instruct, default, include, "~.*", 'quo"te\back', "日本語", "$host"]
    pools:
      - role: mixed
        endpoints:
          - {name: llama-0, address: 10.0.1.1:8000}
          - {name: llama-1, address: "[fd00::11]:8000"}
  - name: qwen
    models: [Qwen/Qwen3-32B]
    nginx_mode: body
    pools:
      - role: prefill
        endpoints: [{name: qwen-p0, address: 10.0.2.1:8000}]
      - role: decode
        endpoints: [{name: qwen-d0, address: 10.0.2.2:8000}]
`

// headerYAML is the stock setup: header mode only, so no njs at all.
const headerYAML = `listen: 127.0.0.1:9090
nginx: {listen: 127.0.0.1:8081, mode: header}
deployments:
  - name: chat
    policy: {name: session-hash}
    pools:
      - role: mixed
        endpoints:
          - {name: chat-0, address: 127.0.0.1:8001}
          - {name: chat-1, address: 127.0.0.1:8002}
`

func mustParse(t testing.TB, y []byte) *config.Config {
	t.Helper()
	cfg, err := config.ParseConfig(y)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func nginxBin(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("nginx")
	if err != nil {
		t.Skip("nginx is not installed: skipping nginx -t")
	}
	if _, err := os.Stat(DefaultModulePath); err != nil {
		t.Skip("njs module is not installed: skipping nginx -t")
	}
	return bin
}

var goldenCases = []struct {
	name string
	yaml []byte
}{
	{"default", config.DefaultConfigYAML},
	{"multi", []byte(multiYAML)},
	{"header", []byte(headerYAML)},
}

func TestRenderGolden(t *testing.T) {
	for _, tc := range goldenCases {
		t.Run(tc.name, func(t *testing.T) {
			out, err := Render(mustParse(t, tc.yaml), RenderOptions{Dir: goldenDir})
			if err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", tc.name+".nginx.conf.golden")
			if *update {
				if err := os.WriteFile(golden, out.Config, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update)", err)
			}
			if !bytes.Equal(out.Config, want) {
				t.Errorf("%s differs from the render (run go test ./nginx -update and review the diff)", golden)
			}
		})
	}
}

// Every golden config passes nginx -t.
func TestRenderNginxT(t *testing.T) {
	bin := nginxBin(t)
	r, err := NewRenderer(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range goldenCases {
		t.Run(tc.name, func(t *testing.T) {
			if err := r.Check(context.Background(), bin, mustParse(t, tc.yaml), RenderOptions{}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// directivesOf is conf without its comment lines.
func directivesOf(conf string) string {
	var directives strings.Builder
	for line := range strings.Lines(conf) {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			directives.WriteString(line)
		}
	}
	return directives.String()
}

func TestRenderModes(t *testing.T) {
	// Without the first-token timer header mode needs no njs at all.
	untimed, err := Render(mustParse(t, []byte(headerYAML+"proxy: {first_token_timing: false}\n")), RenderOptions{Dir: goldenDir})
	if err != nil {
		t.Fatal(err)
	}
	for _, absent := range []string{DefaultModulePath, "js_import", "js_var", "js_body_filter", "@turnout_proxy_pd", "tft="} {
		if strings.Contains(directivesOf(string(untimed.Config)), absent) {
			t.Errorf("header-only config without first_token_timing contains %q: njs must not be needed", absent)
		}
	}
	out, err := Render(mustParse(t, []byte(headerYAML)), RenderOptions{Dir: goldenDir})
	if err != nil {
		t.Fatal(err)
	}
	conf := string(out.Config)
	// With it (the default), njs only for the timer: its variable, and the
	// body filter in every location that proxies to a replica.
	directives := directivesOf(conf)
	for _, absent := range []string{"js_content", "@turnout_proxy_pd", "js_var $turnout_pool"} {
		if strings.Contains(directives, absent) {
			t.Errorf("header-only config contains %q", absent)
		}
	}
	if n := strings.Count(directives, "js_body_filter turnout.tft buffer_type=buffer;"); n != 2 {
		t.Errorf("%d body filters, want 2 (@turnout_proxy, @turnout_retry)", n)
	}
	for _, want := range []string{"load_module " + DefaultModulePath + ";", "js_var $" + contract.FirstTokenNginxVar + ";", contract.FeedbackFieldFirstToken + "=$" + contract.FirstTokenNginxVar + " "} {
		if !strings.Contains(directives, want) {
			t.Errorf("header-only config lacks %q", want)
		}
	}
	for _, want := range []string{"auth_request /_turnout/ask_headers;", "underscores_in_headers on;", "upstream turnout.ep.chat-0 {", "keepalive 32;", "proxy_buffering off;"} {
		if !strings.Contains(conf, want) {
			t.Errorf("header-only config lacks %q", want)
		}
	}
	// Header mode copies the verdict rows the njs copies, from the same
	// table: a new row reaches both modes.
	g := contract.GlueVerdict()
	wantSet := []string{"auth_request_set $turnout_reason $upstream_http_x_turnout_reason;"}
	for _, f := range g.Copied {
		if f.NginxVar != "" {
			wantSet = append(wantSet, "auth_request_set $"+f.NginxVar+" $upstream_http_"+strings.ReplaceAll(strings.ToLower(f.Header), "-", "_")+";")
		}
	}
	for _, want := range wantSet {
		if !strings.Contains(directives, want) {
			t.Errorf("header-only config lacks %q", want)
		}
	}
	out, err = Render(mustParse(t, []byte(multiYAML)), RenderOptions{Dir: goldenDir})
	if err != nil {
		t.Fatal(err)
	}
	conf = string(out.Config)
	for _, want := range []string{
		"load_module " + DefaultModulePath + ";",
		"js_content turnout.route;",
		"proxy_set_body $turnout_body;",
		// An address of the render has its keepalive upstream (twice: the
		// target and the retry target).
		`"\\10.0.2.2:8000" turnout.ep.qwen-d0;`,
		`"\\Qwen/Qwen3-32B" body;`,
		// Special words and regex-looking names stay literal keys.
		`"\\default" header;`, `"\\include" header;`, `"\\~.*" header;`, `"\\quo\"te\\back" header;`,
		"server 10.0.0.1:9090 max_fails=5 fail_timeout=10s;",
		"server [fd00::2]:9090 max_fails=5 fail_timeout=10s backup;",
	} {
		if !strings.Contains(conf, want) {
			t.Errorf("multi config lacks %q", want)
		}
	}
	// The header-mode calls never run a prefill: route_timeout, not the
	// prefill budget the body-mode call of a prefill/decode config gets.
	if n, m := strings.Count(conf, "proxy_read_timeout 250ms;"), strings.Count(conf, "proxy_read_timeout 61000ms;"); n != 2 || m != 1 {
		t.Errorf("route call read timeouts: %d at route_timeout (want 2: ask_headers, after_relay), %d at the prefill budget (want 1: ask_body)", n, m)
	}
	if strings.Contains(conf, "日本語") {
		t.Error("a non-ASCII model name reached the map")
	}
	// The model headers chain, first header first.
	if !strings.Contains(conf, "map $http_x_model $turnout_model {\n        \"\" $turnout_model_1;\n        default $http_x_model;") {
		t.Error("model header chain is not rendered as expected")
	}
}

// Values that could inject nginx.conf text are refused at render time even
// when they got past config.Config.Validate.
func TestRenderRejectsHostileValues(t *testing.T) {
	cases := []struct {
		name string
		edit func(c *config.Config, o *RenderOptions)
	}{
		{"endpoint name", func(c *config.Config, _ *RenderOptions) { c.Deployments[0].Pools[0].Endpoints[0].Name = "a; }" }},
		{"endpoint address", func(c *config.Config, _ *RenderOptions) {
			c.Deployments[0].Pools[0].Endpoints[0].Address = "127.0.0.1:80;include /etc/passwd"
		}},
		{"endpoint host", func(c *config.Config, _ *RenderOptions) { c.Deployments[0].Pools[0].Endpoints[0].Address = "a{b:80" }},
		{"deployment name", func(c *config.Config, _ *RenderOptions) { c.Deployments[0].Name = "x\ny" }},
		{"session header", func(c *config.Config, _ *RenderOptions) { c.SessionHeaders = []string{"x-a $b"} }},
		{"model header", func(c *config.Config, _ *RenderOptions) { c.ModelHeaders = []string{"x-m;"} }},
		{"listen", func(c *config.Config, _ *RenderOptions) { c.Nginx.Listen = "1.2.3.4:80 ssl" }},
		{"syslog", func(c *config.Config, _ *RenderOptions) { c.Feedback.Syslog = "1.2.3.4:99999" }},
		{"route addr", func(c *config.Config, _ *RenderOptions) { c.Proxy.RouteAddrs = []string{"x'y:1"} }},
		{"no route addr", func(c *config.Config, _ *RenderOptions) { c.Proxy.RouteAddrs = nil }},
		{"dir", func(_ *config.Config, o *RenderOptions) { o.Dir = "/tmp/a b" }},
		{"relative dir", func(_ *config.Config, o *RenderOptions) { o.Dir = "rel/dir" }},
		{"user", func(_ *config.Config, o *RenderOptions) { o.User = "root; worker_processes 99" }},
		{"module path", func(_ *config.Config, o *RenderOptions) { o.ModulePath = "/x.so;" }},
		{"mode", func(c *config.Config, _ *RenderOptions) { c.Deployments[0].NginxMode = "lua" }},
		{"upstream collision", func(c *config.Config, _ *RenderOptions) {
			// An endpoint whose upstream name is the pool's: refused, not merged.
			c.Deployments[0].Name = "turnout.ep.x"
			c.Deployments[0].Pools[0].Endpoints[0].Name = "x_mixed"
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := mustParse(t, []byte(headerYAML))
			opts := RenderOptions{Dir: goldenDir}
			tc.edit(cfg, &opts)
			_, err := Render(cfg, opts)
			if !errors.Is(err, ErrRender) {
				t.Fatalf("Render = %v, want ErrRender", err)
			}
		})
	}
}

func TestRenderPDNeedsBodyMode(t *testing.T) {
	cfg := mustParse(t, []byte(multiYAML))
	cfg.Deployments[1].NginxMode = config.NginxModeHeader
	_, err := Render(cfg, RenderOptions{Dir: goldenDir})
	if !errors.Is(err, ErrRender) || !strings.Contains(err.Error(), "needs nginx_mode body") {
		t.Fatalf("Render = %v, want a prefill/decode mode error", err)
	}
}

func TestModelChain(t *testing.T) {
	h := func(n string) headerData { return headerData{Name: n, Var: "$http_" + n} }
	cases := []struct {
		name string
		in   []headerData
		want []modelVar
	}{
		{"none", nil, []modelVar{{Source: "$host", Var: "$turnout_model", Default: `""`}}},
		{"one", []headerData{h("a")}, []modelVar{{Source: "$http_a", Var: "$turnout_model", Default: "$http_a"}}},
		{"three", []headerData{h("a"), h("b"), h("c")}, []modelVar{
			{Source: "$http_a", Var: "$turnout_model", Next: "$turnout_model_1", Default: "$http_a"},
			{Source: "$http_b", Var: "$turnout_model_1", Next: "$turnout_model_2", Default: "$http_b"},
			{Source: "$http_c", Var: "$turnout_model_2", Default: "$http_c"},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := modelChain(tc.in)
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("link %d: got %+v, want %+v", i, got[i], tc.want[i])
				}
			}
		})
	}
}

// nginxMapKey is what nginx makes of a rendered key token "\\KEY": the
// quoted-string escapes of ngx_conf_read_token, then map's one leading
// backslash removed.
func nginxMapKey(token string) string {
	var b strings.Builder
	for i := 0; i < len(token); i++ {
		c := token[i]
		if c == '\\' && i+1 < len(token) {
			switch token[i+1] {
			case '"', '\'', '\\':
				i++
				c = token[i]
			case 't':
				i++
				c = '\t'
			case 'r':
				i++
				c = '\r'
			case 'n':
				i++
				c = '\n'
			}
		}
		b.WriteByte(c)
	}
	return strings.TrimPrefix(b.String(), `\`)
}

func TestMapKey(t *testing.T) {
	cases := []struct {
		in   string
		want string
		ok   bool
	}{
		{"llama", "llama", true},
		{"default", "default", true},
		{`a"b`, `a\"b`, true},
		{`a\b`, `a\\b`, true},
		{"~regex", "~regex", true},
		{"", "", false},
		{"new\nline", "", false},
		{"ünï", "", false},
		{strings.Repeat("a", 257), "", false},
	}
	for _, tc := range cases {
		got, ok := mapKey(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("mapKey(%q) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

// FuzzMapKey: an accepted model name reads back from nginx.conf as exactly
// itself, and never ends the quoted token early.
func FuzzMapKey(f *testing.F) {
	for _, s := range []string{"llama", `q"\`, "default", "~*x", `\\"`, "a;b}{"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, m string) {
		k, ok := mapKey(m)
		if !ok {
			return
		}
		token := `\\` + k
		for i := 0; i < len(token); i++ {
			if token[i] == '\\' {
				i++
				continue
			}
			if token[i] == '"' {
				t.Fatalf("mapKey(%q) = %q ends the quoted token early", m, k)
			}
		}
		if got := nginxMapKey(token); got != m {
			t.Fatalf("mapKey(%q): nginx reads %q", m, got)
		}
	})
}

// FuzzRenderModel: any model name renders into a config nginx -t accepts
// (when nginx is installed): a name can be skipped, never break the file.
func FuzzRenderModel(f *testing.F) {
	for _, s := range []string{"llama", `q"\`, "default", "include", "~*x", "a;b}{", "$host", "hostnames", "x\ny", "日本"} {
		f.Add(s)
	}
	bin, _ := exec.LookPath("nginx")
	if _, err := os.Stat(DefaultModulePath); err != nil {
		bin = ""
	}
	r, err := NewRenderer(nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, m string) {
		cfg := mustParse(t, []byte(headerYAML))
		cfg.Deployments[0].Models = []string{m}
		cfg.Deployments[0].NginxMode = config.NginxModeBody
		if _, err := r.Render(cfg, RenderOptions{Dir: goldenDir}); err != nil {
			t.Fatalf("model %q: %v", m, err)
		}
		if bin != "" {
			if err := r.Check(context.Background(), bin, cfg, RenderOptions{}); err != nil {
				t.Fatalf("model %q: %v", m, err)
			}
		}
	})
}
