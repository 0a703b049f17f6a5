package nginx

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/route"
)

// Live tests run a real nginx (skipped without nginx and njs) on loopback.

func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// runNginx starts nginx (daemon off) on dir/nginx.conf, waits until listen
// accepts and stops it at cleanup.
func runNginx(t *testing.T, bin, dir, listen string) *exec.Cmd {
	t.Helper()
	var stderr bytes.Buffer
	cmd := exec.Command(bin, "-p", dir, "-c", filepath.Join(dir, ConfigFile), "-e", "stderr", "-g", "daemon off;")
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, ErrorLogName))
			t.Logf("nginx stderr:\n%s\nerror.log:\n%s", stderr.Bytes(), b)
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", listen, 100*time.Millisecond)
		if err == nil {
			c.Close()
			return cmd
		}
		select {
		case <-done:
			t.Fatalf("nginx exited: %s", stderr.Bytes())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("nginx did not listen on %s", listen)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func userOpt() string {
	if os.Geteuid() == 0 {
		return "root" // workers as nobody could not enter t.TempDir()
	}
	return ""
}

// The njs insertAt, given turnout's body edit (route.BodyEdit, as the
// X-Turnout-Kv-Insert/-At headers carry it), builds the same decode body as
// route.DecodeBody, byte for byte, on the path production uses
// (r.requestText, base64 header).
func TestNJSInsertAtMatchesGo(t *testing.T) {
	bin := nginxBin(t)
	r, err := NewRenderer(nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	listen := freeAddr(t)
	if err := os.MkdirAll(filepath.Join(dir, "tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	user := ""
	if u := userOpt(); u != "" {
		user = "user " + u + ";"
	}
	conf := fmt.Sprintf(`load_module %[1]s;
%[2]s
pid %[3]s/nginx.pid;
error_log %[3]s/error.log warn;
events {}
http {
    client_body_temp_path %[3]s/tmp/body;
    proxy_temp_path %[3]s/tmp/proxy;
    fastcgi_temp_path %[3]s/tmp/fastcgi;
    uwsgi_temp_path %[3]s/tmp/uwsgi;
    scgi_temp_path %[3]s/tmp/scgi;
    access_log off;
    client_body_buffer_size 1m;
    js_path %[3]s;
    js_import t from %[3]s/wrap.js;
    server {
        listen %[4]s;
        location / { js_content t.decode; }
    }
}
`, DefaultModulePath, user, dir, listen)
	wrap := `import turnout from 'turnout.js';
function decode(r) {
    var out = turnout.insertAt(r.requestText || '', r.headersIn['X-Ins'], Number(r.headersIn['X-At']));
    if (out === null) {
        r.return(422, 'null');
        return;
    }
    r.return(200, out);
}
export default {decode};
`
	files := []File{{Name: JSFile, Data: r.js}, {Name: "wrap.js", Data: []byte(wrap)}, {Name: ConfigFile, Data: []byte(conf)}}
	if err := WriteFiles(dir, files); err != nil {
		t.Fatal(err)
	}
	runNginx(t, bin, dir, listen)

	kv := `{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[1,2,3],"remote_engine_id":"eng-1","remote_host":"127.0.0.1","remote_port":5600,"tp_size":1}`
	cases := []struct{ name, body, kv string }{
		{"plain", `{"model":"m","stream":true}`, kv},
		{"spaces", ` { } `, kv},
		{"empty", `{}`, kv},
		{"empty with newline", "{\n}", kv},
		{"leading whitespace", "\n\t {\"a\":1}", kv},
		{"unicode", `{"messages":[{"role":"user","content":"日本語 — ünïcödé 😀"}]}`, kv},
		{"escapes", `{"s":"\u00e9\ud83d\ude00 \"q\" \\ \/","k\"ey":"v"}`, kv},
		{"numbers untouched", `{"temperature":0.70,"n":1e400,"seed":-0.0,"max_tokens":16}`, kv},
		{"nested", `{"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"model":"m"}`, kv},
		{"unicode kv", `{"model":"m"}`, `{"remote_engine_id":"é-engine","remote_block_ids":[]}`},
		{"array body", `[1,2]`, kv},
		{"string body", `"x"`, kv},
		{"empty body", ``, kv},
	}
	c := &http.Client{Timeout: 5 * time.Second}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			want, werr := route.DecodeBody([]byte(tc.body), []byte(tc.kv))
			req, _ := http.NewRequest(http.MethodPost, "http://"+listen+"/", strings.NewReader(tc.body))
			ins, at := route.BodyEdit([]byte(tc.body), []byte(tc.kv), nil)
			req.Header.Set("X-Ins", base64.StdEncoding.EncodeToString(ins))
			req.Header.Set("X-At", strconv.Itoa(at))
			res, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if werr != nil {
				if res.StatusCode != 422 {
					t.Fatalf("Go refuses (%v), njs answered %d %q", werr, res.StatusCode, got)
				}
				return
			}
			if res.StatusCode != 200 || !bytes.Equal(got, want) {
				t.Fatalf("njs %d:\n%q\nGo:\n%q", res.StatusCode, got, want)
			}
		})
	}
}

// syncYAML is a one-deployment config; extra endpoints come in as YAML lines.
func syncYAML(listen, extra string) []byte {
	return fmt.Appendf(nil, `listen: 127.0.0.1:1
nginx: {listen: %q}
deployments:
  - name: llama
    pools:
      - role: mixed
        endpoints:
          - {name: a, address: 127.0.0.1:2}
%s`, listen, extra)
}

// Sync writes files while nginx is down, then reloads a running nginx only
// when the render changed, with a reason naming the change; a config nginx
// refuses is never written.
func TestSyncReloadsOnlyOnChange(t *testing.T) {
	bin := nginxBin(t)
	dir := t.TempDir()
	listen := freeAddr(t)
	var logs bytes.Buffer
	log := zerolog.New(&logs)
	s, err := NewSyncer(SyncOptions{Render: RenderOptions{Dir: dir, User: userOpt(), Workers: 1}, NginxBin: bin}, &log)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cfg1 := mustParse(t, syncYAML(listen, ""))
	if err := s.Sync(ctx, cfg1); err != nil {
		t.Fatalf("sync with nginx down: %v", err)
	}
	if !strings.Contains(logs.String(), "nginx is not running") {
		t.Errorf("no 'not running' log: %s", logs.String())
	}
	cmd := runNginx(t, bin, dir, listen)
	master := cmd.Process.Pid
	// The master binds the port before it forks its worker: the listener
	// answering does not mean the worker exists yet.
	workers := Workers(master)
	for end := time.Now().Add(5 * time.Second); len(workers) == 0 && time.Now().Before(end); workers = Workers(master) {
		time.Sleep(20 * time.Millisecond)
	}
	if len(workers) != 1 {
		t.Fatalf("workers %v, want 1", workers)
	}

	logs.Reset()
	if err := s.Sync(ctx, cfg1); err != nil {
		t.Fatal(err)
	}
	if w := Workers(master); !slices.Equal(w, workers) || strings.Contains(logs.String(), "reloading") {
		t.Fatalf("unchanged config reloaded nginx: workers %v -> %v, log %s", workers, w, logs.String())
	}

	cfg2 := mustParse(t, syncYAML(listen, "          - {name: b, address: 127.0.0.1:3}\n"))
	if err := s.Sync(ctx, cfg2); err != nil {
		t.Fatal(err)
	}
	w2 := Workers(master)
	if !slices.ContainsFunc(w2, func(w int) bool { return !slices.Contains(workers, w) }) {
		t.Fatalf("changed config did not reload: workers %v -> %v", workers, w2)
	}
	if !strings.Contains(logs.String(), `"reason":"server b=127.0.0.1:3 added to pool llama_mixed"`) {
		t.Errorf("reload reason not logged: %s", logs.String())
	}
	conf, _ := os.ReadFile(filepath.Join(dir, ConfigFile))
	if !strings.Contains(string(conf), "upstream turnout.ep.b {") {
		t.Error("nginx.conf was not rewritten")
	}

	// nginx -t refuses an address it cannot resolve: nothing is written.
	bad := mustParse(t, syncYAML(listen, "          - {name: c, address: no-such-host.invalid:80}\n"))
	if err := s.Sync(ctx, bad); err == nil {
		t.Fatal("sync of a config nginx -t refuses succeeded")
	}
	if after, _ := os.ReadFile(filepath.Join(dir, ConfigFile)); !bytes.Equal(after, conf) {
		t.Error("a refused config was written")
	}
}

func TestReloadReason(t *testing.T) {
	p := func(m map[string][]string) *Summary { return &Summary{Pools: m} }
	cases := []struct {
		name       string
		prev, next *Summary
		want       string
	}{
		{"unknown", nil, p(map[string][]string{"a": {"x=1"}}), "the rendered nginx.conf differs from the one on disk"},
		{"added", p(map[string][]string{"a": {"x=1"}}), p(map[string][]string{"a": {"x=1", "y=2"}}), "server y=2 added to pool a"},
		{"moved", p(map[string][]string{"a": {"x=1"}}), p(map[string][]string{"a": {"x=2"}}), "server x=2 added to pool a; server x=1 removed from pool a"},
		{"pools", p(map[string][]string{"a": {"x=1"}}), p(map[string][]string{"b": {"x=1", "y=1"}}), "pool b added with 2 servers; pool a removed"},
		{"settings", p(map[string][]string{"a": {"x=1"}}), p(map[string][]string{"a": {"x=1"}}), "settings other than the pools changed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := ReloadReason(tc.prev, tc.next); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// Without a running nginx (and without the binary) Sync only keeps the
// files current, and rewrites them only when the render changed.
func TestSyncWritesFilesWithoutNginx(t *testing.T) {
	dir := t.TempDir()
	s, err := NewSyncer(SyncOptions{Render: RenderOptions{Dir: dir}, NginxBin: "-"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Sync(ctx, mustParse(t, syncYAML("127.0.0.1:8081", ""))); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, ConfigFile)
	st1, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, JSFile)); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(ctx, mustParse(t, syncYAML("127.0.0.1:8081", ""))); err != nil {
		t.Fatal(err)
	}
	if st2, _ := os.Stat(path); !os.SameFile(st1, st2) {
		t.Error("an unchanged render rewrote nginx.conf")
	}
	if err := s.Sync(ctx, mustParse(t, syncYAML("127.0.0.1:8082", ""))); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); !strings.Contains(string(b), "listen 127.0.0.1:8082;") {
		t.Error("a changed render was not written")
	}
	if _, err := NewSyncer(SyncOptions{Render: RenderOptions{Dir: "relative"}}, nil); err == nil {
		t.Error("a relative directory was accepted")
	}
}
