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
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/lab/testenv/freeport"
	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/contract"
)

// Live tests run a real nginx (skipped without nginx and njs) on loopback.

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

// The njs insertAt, given turnout's body edit (contract.BodyEdit, as the
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
	listen := freeport.Addr(t)
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
			ins, at := contract.BodyEdit([]byte(tc.body), []byte(tc.kv), nil)
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
	listen := freeport.Addr(t)
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

	// A replica more: requests go to the address turnout answers, so
	// nothing is reloaded or written; the reason is logged.
	conf, _ := os.ReadFile(filepath.Join(dir, ConfigFile))
	cfg2 := mustParse(t, syncYAML(listen, "          - {name: b, address: 127.0.0.1:3}\n"))
	if err := s.Sync(ctx, cfg2); err != nil {
		t.Fatal(err)
	}
	if w := Workers(master); !slices.Equal(w, workers) || strings.Contains(logs.String(), "reloading") {
		t.Fatalf("a replica added reloaded nginx: workers %v -> %v, log %s", workers, w, logs.String())
	}
	if !strings.Contains(logs.String(), `"reason":"server 127.0.0.1:3 added to pool llama_mixed"`) {
		t.Errorf("membership change not logged: %s", logs.String())
	}
	if after, _ := os.ReadFile(filepath.Join(dir, ConfigFile)); !bytes.Equal(after, conf) {
		t.Error("a membership change rewrote nginx.conf (it must stay what nginx runs)")
	}
	// The same difference at the next sync (until a reload) is not logged
	// at info again.
	if err := s.Sync(ctx, cfg2); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(logs.String(), `"level":"info"`); n != 1 {
		t.Errorf("an unchanged replica difference was logged again at info (%d info lines): %s", n, logs.String())
	}

	// A structural change reloads, with its reason.
	logs.Reset()
	cfg3 := mustParse(t, syncYAML(listen, "          - {name: b, address: 127.0.0.1:3}\nmax_body: 300000\n"))
	if err := s.Sync(ctx, cfg3); err != nil {
		t.Fatal(err)
	}
	w2 := Workers(master)
	if !slices.ContainsFunc(w2, func(w int) bool { return !slices.Contains(workers, w) }) {
		t.Fatalf("changed config did not reload: workers %v -> %v", workers, w2)
	}
	if !strings.Contains(logs.String(), `"reason":"settings other than the replicas changed"`) {
		t.Errorf("reload reason not logged: %s", logs.String())
	}
	conf, _ = os.ReadFile(filepath.Join(dir, ConfigFile))
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

func TestPlanSync(t *testing.T) {
	run := func(structure string, pools map[string][]string, known ...string) Running {
		r := Running{Structure: structure, Pools: pools, Known: map[string]bool{}}
		for _, k := range known {
			r.Known[k] = true
		}
		return r
	}
	next := func(structure string, pools map[string][]string) *Summary {
		return &Summary{Structure: structure, Pools: pools}
	}
	cases := []struct {
		name   string
		run    Running
		next   *Summary
		reload bool
		want   string
	}{
		{"added", run("s", map[string][]string{"a": {"10.0.0.1:1"}}), next("s", map[string][]string{"a": {"x=10.0.0.1:1", "y=10.0.0.2:1"}}),
			false, "server 10.0.0.2:1 added to pool a"},
		{"moved", run("s", map[string][]string{"a": {"10.0.0.1:1", "10.0.0.3:1"}}), next("s", map[string][]string{"a": {"x=10.0.0.2:1", "z=10.0.0.3:1"}}),
			false, "server 10.0.0.2:1 added to pool a; server 10.0.0.1:1 removed from pool a"},
		{"pool left without its servers", run("s", map[string][]string{"a": {"10.0.0.1:1"}}), next("s", map[string][]string{"a": {"x=10.0.0.2:1"}}),
			true, "none of the servers nginx balances pool a over (fail-open, requests turnout is not asked about) is left"},
		{"empty pool gets servers", run("s", map[string][]string{"a": {}}), next("s", map[string][]string{"a": {"x=10.0.0.2:1"}}),
			true, "none of the servers nginx balances pool a over (fail-open, requests turnout is not asked about) is left"},
		{"last server removed", run("s", map[string][]string{"a": {"10.0.0.1:1"}}), next("s", map[string][]string{"a": {}}),
			false, "server 10.0.0.1:1 removed from pool a"},
		{"host name", run("s", map[string][]string{"a": {"10.0.0.1:1"}}), next("s", map[string][]string{"a": {"x=10.0.0.1:1", "y=vllm-1.svc:80"}}),
			true, "server vllm-1.svc:80 in pool a is a host name, which nginx resolves only when it loads its config"},
		{"known host name", run("s", map[string][]string{"a": {"10.0.0.1:1"}}, "vllm-1.svc:80"), next("s", map[string][]string{"a": {"x=10.0.0.1:1", "y=vllm-1.svc:80"}}),
			false, "server vllm-1.svc:80 added to pool a"},
		{"ipv6", run("s", map[string][]string{"a": {"[fd00::1]:1"}}), next("s", map[string][]string{"a": {"x=[fd00::1]:1", "y=[fd00::2]:1"}}),
			false, "server [fd00::2]:1 added to pool a"},
		{"pools", run("s", map[string][]string{"a": {"10.0.0.1:1"}}), next("t", map[string][]string{"b": {"x=10.0.0.1:1", "y=10.0.0.2:1"}}),
			true, "pool b added with 2 servers; pool a removed"},
		{"settings", run("s", map[string][]string{"a": {"10.0.0.1:1"}}), next("t", map[string][]string{"a": {"x=10.0.0.1:1"}}),
			true, "settings other than the replicas changed"},
		{"no structure line", run("", map[string][]string{"a": {"10.0.0.1:1"}}), next("t", map[string][]string{"a": {"x=10.0.0.1:1"}}),
			true, "the nginx.conf on disk has no turnout-structure line (not rendered by this version)"},
		{"same members", run("s", map[string][]string{"a": {"10.0.0.1:1", "10.0.0.2:1"}}), next("s", map[string][]string{"a": {"y=10.0.0.2:1", "renamed=10.0.0.1:1"}}),
			false, "the order or the names of the replicas changed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := PlanSync(tc.run, tc.next)
			if p.Reload != tc.reload || p.Reason != tc.want {
				t.Errorf("got reload=%v %q, want reload=%v %q", p.Reload, p.Reason, tc.reload, tc.want)
			}
		})
	}
}

// ParseRunning reads back what Render wrote: the structure, the pools'
// servers (not the placeholder of an empty pool) and the per-replica
// upstreams' addresses.
func TestParseRunning(t *testing.T) {
	cfg := mustParse(t, []byte(`listen: 127.0.0.1:1
nginx: {listen: 127.0.0.1:8080}
deployments:
  - name: llama
    pools:
      - role: mixed
        endpoints:
          - {name: a, address: 127.0.0.1:2}
          - {name: b, address: "[fd00::1]:3"}
  - name: empty
    models: [e]
    pools:
      - role: mixed
        endpoints: []
`))
	out, err := Render(cfg, RenderOptions{Dir: goldenDir})
	if err != nil {
		t.Fatal(err)
	}
	r := ParseRunning(out.Config)
	if r.Structure == "" || r.Structure != out.Summary.Structure {
		t.Errorf("structure %q, want %q", r.Structure, out.Summary.Structure)
	}
	want := map[string][]string{"llama_mixed": {"127.0.0.1:2", "[fd00::1]:3"}, "empty_mixed": {}}
	if !reflect.DeepEqual(r.Pools, want) {
		t.Errorf("pools %v, want %v", r.Pools, want)
	}
	if !reflect.DeepEqual(r.Known, map[string]bool{"127.0.0.1:2": true, "[fd00::1]:3": true}) {
		t.Errorf("known %v", r.Known)
	}
	// Replicas change, the structure does not.
	cfg.Deployments[0].Pools[0].Endpoints[1].Address = "127.0.0.1:4"
	out2, err := Render(cfg, RenderOptions{Dir: goldenDir})
	if err != nil {
		t.Fatal(err)
	}
	if out2.Summary.Structure != out.Summary.Structure {
		t.Error("a replica's address changed the structure")
	}
	if p := PlanSync(r, &out2.Summary); p.Reload || p.Reason != "server 127.0.0.1:4 added to pool llama_mixed; server [fd00::1]:3 removed from pool llama_mixed" {
		t.Errorf("plan of a moved replica: %+v", p)
	}
	cfg.MaxBody++
	out3, err := Render(cfg, RenderOptions{Dir: goldenDir})
	if err != nil {
		t.Fatal(err)
	}
	if out3.Summary.Structure == out.Summary.Structure {
		t.Error("max_body did not change the structure")
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
