package bench

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/turnout/turnout/nginx"
)

// nginxInstall is the hint every "nginx missing" message carries.
const nginxInstall = "apt-get install -y nginx libnginx-mod-http-js"

// NginxMissing says why the nginx rows cannot run, or "" when they can:
// the nginx binary is needed for every row, the njs module (module, default
// nginx.DefaultModulePath; "-" = built in) only when needJS (body mode).
func NginxMissing(bin, module string, needJS bool) string {
	if bin == "" {
		return "nginx disabled"
	}
	if _, err := exec.LookPath(bin); err != nil {
		return fmt.Sprintf("nginx not found (%s; %s)", bin, nginxInstall)
	}
	if !needJS {
		return ""
	}
	if module == "" {
		module = nginx.DefaultModulePath
	}
	if module == "-" {
		return ""
	}
	if _, err := os.Stat(module); err != nil {
		return fmt.Sprintf("njs module not found (%s; %s)", module, nginxInstall)
	}
	return ""
}

// maxBodyLimit is the largest max_body turnout's config accepts.
const maxBodyLimit = 64 << 20

// BodyLimit returns a max_body that admits every request's streamed chat
// body, rounded up to 64 KiB, within [256 KiB, 64 MiB]. nginx answers 413
// to a body over max_body (njs can only read a body held in memory), where
// HAProxy forwards it and turnout routes on its first max_body bytes; so the
// nginx rows of a long-prompt replay raise the limit instead of failing the
// longest prompts and skewing hit ratios against the bound.
func BodyLimit(reqs []Request, model string) int {
	var buf []byte
	largest := 0
	for i := range reqs {
		buf = AppendChatBody(buf[:0], &reqs[i], BodyOptions{Model: reqs[i].ModelOr(model), Stream: true})
		largest = max(largest, len(buf))
	}
	const step = 64 << 10
	return min(max((largest+step-1)/step*step, stackMaxBody), maxBodyLimit)
}

// PlainNginxOptions describe an nginx that balances on its own.
type PlainNginxOptions struct {
	// Dir is the prefix: pid, error log and temp files stay in it.
	Dir    string
	Listen string
	// Balance is "" (round robin) or least_conn.
	Balance string
	Servers []Endpoint
	// MaxBody > 0 gives the baseline turnout's body buffer: bodies up to
	// max_body held in memory (client_body_buffer_size and
	// client_max_body_size = MaxBody), as the rendered config does. 0 keeps
	// nginx's defaults (8 KiB buffer, larger bodies go to a temp file).
	MaxBody int
	// MaxBodyLimit raises client_max_body_size alone (0: nginx's 1 MiB).
	MaxBodyLimit int
	// User is the user directive ("" = none; a root master needs it so its
	// workers can enter a 0700 temp directory).
	User string
	// Keepalive is idle connections per worker and replica (default 32, as
	// rendered for turnout's per-replica upstreams).
	Keepalive int
}

// PlainNginxConfig renders the "nginx alone" baseline as an operator runs it
// without turnout: nginx's defaults plus what streaming to replicas needs
// (HTTP/1.1 keepalive upstream, proxy_buffering off for SSE), one upstream
// with nginx's own balancing, no routing call. MaxBody adds turnout's
// in-memory body buffer (the equal-buffer row).
func PlainNginxConfig(o PlainNginxOptions) []byte {
	ka := o.Keepalive
	if ka <= 0 {
		ka = 32
	}
	var b strings.Builder
	b.WriteString("# nginx alone (turnout-lab bench baseline).\n")
	if o.User != "" {
		fmt.Fprintf(&b, "user %s;\n", o.User)
	}
	fmt.Fprintf(&b, "worker_processes auto;\npid %s/nginx.pid;\nerror_log %s/error.log warn;\n", o.Dir, o.Dir)
	b.WriteString("\nevents {\n    worker_connections 4096;\n}\n\nhttp {\n")
	// Temp files stay in the prefix, as in the rendered config.
	for _, t := range [][2]string{{"client_body", "body"}, {"proxy", "proxy"}, {"fastcgi", "fastcgi"}, {"uwsgi", "uwsgi"}, {"scgi", "scgi"}} {
		fmt.Fprintf(&b, "    %s_temp_path %s/tmp/%s;\n", t[0], o.Dir, t[1])
	}
	fmt.Fprintf(&b, `    access_log off;
    server_tokens off;
    default_type application/json;
    underscores_in_headers on;
`)
	// Streaming both ways is nginx at its best for LLM requests: the body
	// goes to the replica as it arrives instead of into a temp file beyond
	// the 8 KiB default buffer. The equal-buffer row buffers in memory, as
	// the rendered config does (so a failed connect can be retried).
	reqBuffering := "proxy_request_buffering off;"
	switch {
	case o.MaxBody > 0:
		reqBuffering = "proxy_request_buffering on;"
		fmt.Fprintf(&b, "    client_max_body_size %d;\n    client_body_buffer_size %d;\n", o.MaxBody, o.MaxBody)
	case o.MaxBodyLimit > 0:
		fmt.Fprintf(&b, "    client_max_body_size %d;\n", o.MaxBodyLimit)
	}
	b.WriteString(`
    upstream replicas {
`)
	if o.Balance != "" {
		fmt.Fprintf(&b, "        %s;\n", o.Balance)
	}
	for _, s := range o.Servers {
		fmt.Fprintf(&b, "        server %s max_fails=1 fail_timeout=10s;\n", s.Address)
	}
	// The rendered config keeps this many per replica upstream; one shared
	// upstream gets the same total.
	fmt.Fprintf(&b, "        keepalive %d;\n    }\n\n", ka*max(len(o.Servers), 1))
	fmt.Fprintf(&b, `    server {
        listen %s;
        proxy_http_version 1.1;
        proxy_buffering off;
        %s
        proxy_connect_timeout 2000ms;
        proxy_send_timeout 600000ms;
        proxy_read_timeout 600000ms;
        proxy_next_upstream error;
        proxy_set_header Host $http_host;
        proxy_set_header Connection "";
        proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;

        location / {
            proxy_pass http://replicas;
        }
    }
}
`, o.Listen, reqBuffering)
	return []byte(b.String())
}

// nginxUser is the user directive a bench nginx needs: a master started as
// root runs its workers as nobody, which cannot enter the 0700 work
// directory (os.MkdirTemp).
func nginxUser() string {
	if os.Geteuid() == 0 {
		return "root"
	}
	return ""
}

// startNginx runs nginx in the foreground on dir/nginx.conf with dir as its
// prefix; -e stderr keeps startup errors in the process log instead of the
// distribution's error log path.
func (st *Stack) startNginx(ctx context.Context, logDir, dir, bin string) error {
	if err := os.MkdirAll(filepath.Join(dir, "tmp"), 0o755); err != nil {
		return fmt.Errorf("nginx dir: %w", err)
	}
	p, err := st.procs.start(logDir, "nginx", bin, "-p", dir, "-c", filepath.Join(dir, nginx.ConfigFile),
		"-e", "stderr", "-g", "daemon off;")
	if err != nil {
		return err
	}
	st.ProxyPID = p.cmd.Process.Pid
	// As for HAProxy: a GET passes without a routing decision, so this proves
	// nginx and a replica are up.
	return waitHTTP(ctx, p, st.FrontURL+"/v1/models", http.StatusOK, startupWait)
}

// renderNginxArgs are the `turnout render nginx` flags for dir.
func renderNginxArgs(dir, module string) []string {
	args := []string{"--out", dir}
	if u := nginxUser(); u != "" {
		args = append(args, "--nginx-user", u)
	}
	if module != "" {
		args = append(args, "--nginx-js-module", module)
	}
	return args
}
