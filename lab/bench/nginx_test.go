package bench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/policy"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/nginx"
)

func plainNginxOpts(dir string) PlainNginxOptions {
	return PlainNginxOptions{
		Dir: dir, Listen: "127.0.0.1:8081", MaxBody: 1 << 18,
		Servers: []Endpoint{{Name: "r0", Address: "127.0.0.1:1"}, {Name: "r1", Address: "127.0.0.1:2"}},
	}
}

func TestPlainNginxConfig(t *testing.T) {
	cfg := string(PlainNginxConfig(plainNginxOpts("/tmp/x")))
	for _, want := range []string{
		"listen 127.0.0.1:8081;", "server 127.0.0.1:2 max_fails=1", "keepalive 64;", // 32 per replica, as rendered
		"proxy_http_version 1.1;", "proxy_buffering off;", `proxy_set_header Connection "";`,
		"client_body_buffer_size 262144;", "client_max_body_size 262144;", "pid /tmp/x/nginx.pid;", "proxy_temp_path /tmp/x/tmp/proxy;",
		"proxy_pass http://replicas;",
	} {
		if !strings.Contains(cfg, want) {
			t.Errorf("config lacks %q:\n%s", want, cfg)
		}
	}
	// Round robin is nginx's default: no balancing directive, no user, no njs.
	for _, bad := range []string{"least_conn", "user ", "js_", "load_module", "auth_request"} {
		if strings.Contains(cfg, bad) {
			t.Errorf("round-robin baseline has %q:\n%s", bad, cfg)
		}
	}
	o := plainNginxOpts("/tmp/x")
	o.Balance, o.User, o.Keepalive = "least_conn", "root", 8
	cfg = string(PlainNginxConfig(o))
	for _, want := range []string{"least_conn;", "user root;", "keepalive 16;"} {
		if !strings.Contains(cfg, want) {
			t.Errorf("config lacks %q:\n%s", want, cfg)
		}
	}
	// The honest baseline keeps nginx's own body buffering; a replay that
	// needs large bodies raises only the limit.
	o = plainNginxOpts("/tmp/x")
	o.MaxBody, o.MaxBodyLimit = 0, 1<<20
	cfg = string(PlainNginxConfig(o))
	if strings.Contains(cfg, "client_body_buffer_size") || !strings.Contains(cfg, "client_max_body_size 1048576;") {
		t.Errorf("default-buffer baseline:\n%s", cfg)
	}
}

// nginx itself accepts the baseline, when it is installed.
func TestPlainNginxConfigNginxT(t *testing.T) {
	bin, err := exec.LookPath("nginx")
	if err != nil {
		t.Skip("nginx not installed: skipping nginx -t of the baseline config")
	}
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	o := plainNginxOpts(dir)
	o.Balance, o.User = "least_conn", nginxUser()
	p := filepath.Join(dir, nginx.ConfigFile)
	if err := os.WriteFile(p, PlainNginxConfig(o), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "-t", "-q", "-p", dir, "-c", p, "-e", "stderr").CombinedOutput(); err != nil {
		t.Fatalf("nginx -t: %v\n%s", err, out)
	}
}

// The generated turnout config carries the nginx section, and turnout's
// renderer turns it into the mode asked for.
func TestTurnoutConfigNginx(t *testing.T) {
	for mode, want := range map[string]string{config.NginxModeHeader: "auth_request /_turnout/ask_headers;", config.NginxModeBody: "js_content turnout.route;"} {
		cfgText := TurnoutConfig(ConfigOptions{
			Listen: "127.0.0.1:9", Model: "llama", Policy: PolicySpec{Policy: policy.SessionHashType}, DisableHealth: true,
			Syslog: "127.0.0.1:9514", NginxListen: "127.0.0.1:8081", NginxDir: "/tmp/ng", NginxMode: mode,
			Endpoints: []Endpoint{{Name: "r0", Address: "127.0.0.1:1"}, {Name: "r1", Address: "127.0.0.1:2"}},
		})
		cfg, err := config.ParseConfig(cfgText)
		if err != nil {
			t.Fatalf("%s: %v\n%s", mode, err, cfgText)
		}
		if cfg.Nginx.Listen != "127.0.0.1:8081" || cfg.Nginx.Dir != "/tmp/ng" || cfg.Deployments[0].NginxMode != mode {
			t.Fatalf("%s: nginx section %+v, deployment mode %q", mode, cfg.Nginx, cfg.Deployments[0].NginxMode)
		}
		r, err := nginx.Render(cfg, nginx.RenderOptions{})
		if err != nil {
			t.Fatalf("%s: render: %v", mode, err)
		}
		if !strings.Contains(string(r.Config), want) || !strings.Contains(string(r.Config), "listen 127.0.0.1:8081;") {
			t.Errorf("%s: rendered config lacks %q", mode, want)
		}
	}
	// No nginx section unless asked for.
	if cfg := string(TurnoutConfig(ConfigOptions{Listen: "127.0.0.1:9", Model: "m", Policy: PolicySpec{Policy: "round-robin"}})); strings.Contains(cfg, "nginx") {
		t.Fatalf("unexpected nginx section:\n%s", cfg)
	}
}

func TestProxySpecs(t *testing.T) {
	specs, err := ParsePolicySpecs("nginx-roundrobin;nginx-leastconn;haproxy-roundrobin;prefix-affinity")
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{ProxyNginx, ProxyNginx, ProxyHAProxy, ProxyNginx} {
		if got := specs[i].Proxy(ProxyNginx); got != want {
			t.Errorf("%s behind nginx: proxy %s, want %s", specs[i], got, want)
		}
	}
	if specs[3].Proxy(ProxyHAProxy) != ProxyHAProxy || specs[0].Proxy(ProxyHAProxy) != ProxyNginx {
		t.Error("turnout policies follow --proxy; proxy-alone rows name their own")
	}
	if _, err := ParsePolicySpec("nginx-leastconn:a=1"); err == nil {
		t.Error("a proxy-alone spec took parameters")
	}
	def := DefaultPoliciesFor(ProxyNginx)
	if def[0].Policy != NginxRoundRobin || def[1].Policy != NginxLeastConn || len(def) != len(DefaultPolicies()) {
		t.Fatalf("nginx defaults %v", def)
	}
	for _, s := range def[2:] {
		if s.IsProxyAlone() {
			t.Fatalf("nginx defaults %v", def)
		}
	}

	o := E2EOptions{ProxySetup: ProxySetup{Proxy: ProxyNginx}}
	if ng, njs := o.NeedsNginx(specs[:2]); !ng || njs {
		t.Errorf("nginx alone: nginx %v njs %v", ng, njs)
	}
	if ng, njs := o.NeedsNginx(specs); !ng || !njs {
		t.Errorf("body mode: nginx %v njs %v", ng, njs)
	}
	o.NginxMode = config.NginxModeHeader
	if ng, njs := o.NeedsNginx(specs); !ng || !njs {
		t.Errorf("header mode (the first-token timer): nginx %v njs %v", ng, njs)
	}
	if m := e2eMode(specs[3], o); m != "e2e-nginx-header" {
		t.Errorf("mode %s", m)
	}
	if m := e2eMode(specs[2], o); m != "e2e" {
		t.Errorf("mode %s", m)
	}
	if ng, _ := (&E2EOptions{}).NeedsNginx(specs[2:]); ng {
		t.Error("haproxy run needs nginx")
	}
}

// fakeBin is an executable that only has to exist (availability checks).
func fakeBin(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "nginx")
	if err := os.WriteFile(p, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestNginxMissing(t *testing.T) {
	bin := fakeBin(t)
	mod := filepath.Join(t.TempDir(), "njs.so")
	if msg := NginxMissing(filepath.Join(t.TempDir(), "none"), mod, false); !strings.Contains(msg, "nginx not found") {
		t.Errorf("missing binary: %q", msg)
	}
	if msg := NginxMissing(bin, mod, false); msg != "" {
		t.Errorf("njs not needed: %q", msg)
	}
	if msg := NginxMissing(bin, mod, true); !strings.Contains(msg, "njs module not found") || !strings.Contains(msg, mod) {
		t.Errorf("missing njs: %q", msg)
	}
	if msg := NginxMissing(bin, "-", true); msg != "" {
		t.Errorf("built-in njs: %q", msg)
	}
	if err := os.WriteFile(mod, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if msg := NginxMissing(bin, mod, true); msg != "" {
		t.Errorf("njs present: %q", msg)
	}
}

// The cost run's proxy setups: plain proxy first in each group (the
// baseline), then turnout behind it; what cannot run becomes a note row.
func TestProxyStacks(t *testing.T) {
	log := zerolog.Nop()
	bin := fakeBin(t)
	mod := filepath.Join(t.TempDir(), "njs.so")
	if err := os.WriteFile(mod, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	o := CostOptions{Nginx: bin, NginxModule: mod, ProxyPolicy: "prefix-affinity", NginxHeaderPolicy: "session-hash", Log: &log}
	stacks, notes, err := proxyStacks(o)
	if err != nil || len(notes) != 0 {
		t.Fatalf("err %v notes %v", err, notes)
	}
	var got []string
	for _, s := range stacks {
		got = append(got, fmt.Sprintf("%s|%s|%s|%s|%s|%v", s.group, s.name, s.opts.Spec, s.opts.Spec.Proxy(s.opts.Proxy), s.opts.NginxMode, s.opts.PlainNginxBodyBuffer))
	}
	want := []string{
		"nginx|nginx roundrobin|nginx-roundrobin|nginx||false",
		"nginx|nginx roundrobin, client_body_buffer_size 262144 (as body mode renders)|nginx-roundrobin|nginx||true",
		"nginx|nginx+auth_request+turnout session-hash|session-hash|nginx|header|false",
		"nginx|nginx+auth_request+turnout session-hash, first_token_timing: false|session-hash|nginx|header|false",
		"nginx|nginx+njs+turnout prefix-affinity|prefix-affinity|nginx|body|false",
		"nginx|nginx+njs+turnout prefix-affinity, first_token_timing: false|prefix-affinity|nginx|body|false",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("stacks:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// No njs: the rows that need it (body mode, the first-token timer) are
	// notes, the others still run.
	o.NginxModule = mod + ".missing"
	stacks, notes, err = proxyStacks(o)
	if err != nil || len(stacks) != 3 || len(notes) != 2 || !strings.Contains(notes[0].Note, "njs module not found") || notes[0].Group != "nginx" ||
		!stacks[2].opts.NoFirstTokenTiming {
		t.Fatalf("no njs: err %v stacks %d notes %+v", err, len(stacks), notes)
	}
	// No nginx: one note for the group.
	o.Nginx = bin + ".missing"
	stacks, notes, err = proxyStacks(o)
	if err != nil || len(stacks) != 0 || len(notes) != 1 || !strings.Contains(notes[0].Note, "skipped: nginx not found") {
		t.Fatalf("no nginx: err %v stacks %d notes %+v", err, len(stacks), notes)
	}
	// Disabled: nothing at all.
	o.Nginx = ""
	if stacks, notes, err = proxyStacks(o); err != nil || len(stacks)+len(notes) != 0 {
		t.Fatalf("disabled: err %v stacks %v notes %v", err, stacks, notes)
	}
	// HAProxy rows come first, with their own baseline: HAProxy's default
	// buffers, then whole-body buffers, then the default render (SPOE), the
	// same with retry before bytes, with ring feedback, without the first-token timer, then
	// the Lua path; each nginx mode with and without the timer.
	o.HAProxy, o.Nginx, o.NginxModule = bin, bin, mod
	stacks, _, err = proxyStacks(o)
	if err != nil || len(stacks) != 13 || stacks[0].name != "haproxy roundrobin" || stacks[0].opts.PlainBufSize != 0 ||
		stacks[1].opts.PlainBufSize <= 256<<10 || stacks[2].opts.Spec.Proxy(stacks[2].opts.Proxy) != ProxyHAProxy ||
		stacks[2].opts.HAProxyPath != "" || stacks[2].opts.L7Retries || !stacks[3].opts.L7Retries ||
		stacks[2].opts.HAProxyFeedback != "" || stacks[4].opts.HAProxyFeedback != config.HAProxyFeedbackRing || stacks[4].opts.L7Retries ||
		stacks[2].opts.NoFirstTokenTiming || !stacks[5].opts.NoFirstTokenTiming || stacks[5].opts.L7Retries ||
		stacks[6].opts.HAProxyPath != config.HAProxyPathLua || stacks[7].name != "nginx roundrobin" ||
		stacks[9].opts.NoFirstTokenTiming || !stacks[10].opts.NoFirstTokenTiming || stacks[10].opts.NginxMode != config.NginxModeHeader ||
		stacks[11].opts.NoFirstTokenTiming || !stacks[12].opts.NoFirstTokenTiming || stacks[12].opts.NginxMode != config.NginxModeBody {
		t.Fatalf("both: err %v stacks %+v", err, stacks)
	}
	o.ProxyPolicy = "nginx-roundrobin"
	if _, _, err := proxyStacks(o); err == nil {
		t.Fatal("a proxy-alone spec was accepted as turnout's policy")
	}
}

func TestBodyLimit(t *testing.T) {
	reqs := SyntheticTrace(20, 1)
	if got := BodyLimit(reqs, "llama"); got != 256<<10 {
		t.Fatalf("short prompts: %d, want turnout's default", got)
	}
	// 100k words of 6 bytes: about 600 KB, rounded up to 64 KiB.
	ids := make([]uint64, 100_000/BlockTokens+1)
	for i := range ids {
		ids[i] = uint64(i + 1)
	}
	reqs = append(reqs, Request{InputTokens: 100_000, OutputTokens: 1, HashIDs: ids})
	got := BodyLimit(reqs, "llama")
	body := AppendChatBody(nil, &reqs[len(reqs)-1], BodyOptions{Model: "llama", Stream: true})
	if len(body) <= 256<<10 || got%(64<<10) != 0 || got < len(body) || got-len(body) >= 64<<10 {
		t.Fatalf("limit %d for a %d-byte body", got, len(body))
	}
}
