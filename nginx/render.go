// Package nginx renders turnout's nginx setup (nginx.conf and the njs glue)
// and keeps a running nginx in line with turnout's config. nginx sends each
// request to the address turnout answered, so replicas coming and going need
// no reload; nginx OSS has no runtime API, so any other change is a
// re-render, an "nginx -t" and a graceful reload, with its reason logged.
//
//   - render.go: config -> files, from the embedded templates (no I/O).
//   - check.go:  "nginx -t" on a scratch copy.
//   - plan.go:   a new render against the running file: reload or not, why.
//   - sync.go:   the Syncer: render, plan, check, write, reload.
//
// See docs/nginx.md for the two routing modes.
package nginx

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/template"

	"github.com/turnout/turnout/internal/config"

	"github.com/turnout/turnout/internal/proxyconf"
	"github.com/turnout/turnout/route/contract"
)

// File names inside the rendered directory.
const (
	ConfigFile = "nginx.conf"
	JSFile     = "turnout.js"
	// PIDFileName and ErrorLogName are the defaults inside the directory.
	PIDFileName  = "nginx.pid"
	ErrorLogName = "error.log"

	configTemplate = "templates/nginx.conf.tmpl"
	jsTemplate     = "templates/nginx-turnout.js"
	generator      = "turnout render nginx"
)

// DefaultModulePath is where Debian's libnginx-mod-http-js puts njs.
const DefaultModulePath = "/usr/lib/nginx/modules/ngx_http_js_module.so"

// DefaultHeadersMorePath is where Debian's libnginx-mod-http-headers-more-filter
// puts the headers-more module: more_clear_input_headers strips every
// X-Turnout-* / X-Original-* header a client sends, not a fixed list.
const DefaultHeadersMorePath = "/usr/lib/nginx/modules/ngx_http_headers_more_filter_module.so"

// HeadersMoreOff renders without headers-more: only the header names turnout
// itself uses are cleared.
const HeadersMoreOff = "off"

// ErrRender marks config values that cannot be rendered safely.
var ErrRender = errors.New("nginx render")

// RenderOptions say where the rendered files live and how nginx runs;
// nginx.conf refers to the njs file, the pid file, the logs and the temp
// directories by absolute path, so "nginx -p DIR -c DIR/nginx.conf" needs
// nothing outside DIR.
type RenderOptions struct {
	// Dir is the absolute directory the files are written to (default nginx.dir).
	Dir string
	// PIDFile receives the master pid (default Dir/nginx.pid).
	PIDFile string
	// ErrorLog is the error log file (default Dir/error.log).
	ErrorLog string
	// ModulePath is the njs module to load_module when a deployment uses
	// body mode (default DefaultModulePath; "-" = njs is built in, load nothing).
	ModulePath string
	// HeadersMore is the headers-more module to load_module (default
	// DefaultHeadersMorePath; "-" = built in, load nothing; HeadersMoreOff =
	// not used, only turnout's own header names are cleared).
	HeadersMore string
	// User runs the workers ("" = nginx's default; only used when started as root).
	User string
	// Workers is worker_processes (0 = auto).
	Workers int
	// WorkerConnections bounds connections per worker (default 4096).
	WorkerConnections int
	// Keepalive is the idle connections each worker keeps per replica (default 32).
	Keepalive int
}

func (o RenderOptions) withDefaults(cfg *config.Config) RenderOptions {
	o.Dir = cmp.Or(o.Dir, cfg.Nginx.Dir)
	proxyconf.InDir(&o.PIDFile, o.Dir, PIDFileName)
	proxyconf.InDir(&o.ErrorLog, o.Dir, ErrorLogName)
	o.ModulePath = cmp.Or(o.ModulePath, DefaultModulePath)
	o.HeadersMore = cmp.Or(o.HeadersMore, DefaultHeadersMorePath)
	if o.WorkerConnections <= 0 {
		o.WorkerConnections = 4096
	}
	if o.Keepalive <= 0 {
		o.Keepalive = 32
	}
	return o
}

// Rendered is one rendered nginx setup.
type Rendered struct {
	Config []byte
	JS     []byte
	// Summary lists the pools and their servers, for reload reasons.
	Summary Summary
	// Secret: Config holds the feedback token (written 0600).
	Secret bool
}

// File is one output file.
type File = proxyconf.File

// Files lists the output files in write order (nginx.conf last, so a reload
// racing a rewrite never sees a config importing a missing njs file).
func (r *Rendered) Files() []File {
	return []File{{Name: JSFile, Data: r.JS}, {Name: ConfigFile, Data: r.Config, Private: r.Secret}}
}

// Renderer turns a turnout config into nginx files.
type Renderer struct {
	cfg *template.Template
	js  []byte
}

// NewRenderer parses the templates from fsys (turnout.Assets when nil).
func NewRenderer(fsys fs.FS) (*Renderer, error) {
	c, err := proxyconf.ParseTemplates(fsys, "nginx.conf.tmpl", configTemplate)
	if err != nil {
		return nil, err
	}
	// The njs module carries the glue contract (contract_js.go) and
	// nothing per deployment (that lives in nginx.conf variables), so it is
	// rendered once.
	js, err := renderJS(fsys)
	if err != nil {
		return nil, err
	}
	return &Renderer{cfg: c, js: js}, nil
}

// Render renders cfg. Every config value that reaches nginx.conf is checked
// again here (config.Config.Validate already restricts names), so no value
// can add a directive or a block.
func (r *Renderer) Render(cfg *config.Config, opts RenderOptions) (*Rendered, error) {
	opts = opts.withDefaults(cfg)
	d, err := buildData(cfg, opts)
	if err != nil {
		return nil, err
	}
	// The structure is the render without replicas: what a change of
	// membership alone leaves as it is (plan.go).
	var conf bytes.Buffer
	if err := r.cfg.Execute(&conf, d.withoutReplicas()); err != nil {
		return nil, fmt.Errorf("render %s: %w", ConfigFile, err)
	}
	sum := sha256.Sum256(conf.Bytes())
	d.Structure = hex.EncodeToString(sum[:8])
	d.summary.Structure = d.Structure
	conf.Reset()
	if err := r.cfg.Execute(&conf, d); err != nil {
		return nil, fmt.Errorf("render %s: %w", ConfigFile, err)
	}
	return &Rendered{Config: conf.Bytes(), JS: r.js, Summary: d.summary, Secret: cfg.Feedback.LineToken() != ""}, nil
}

// withoutReplicas is d with no replica anywhere: no per-replica upstream
// or map entry, every pool empty.
func (d *tmplData) withoutReplicas() *tmplData {
	s := *d
	s.Endpoints, s.Targets = nil, nil
	s.Pools = make([]poolData, len(d.Pools))
	for i, p := range d.Pools {
		s.Pools[i] = poolData{Name: p.Name}
	}
	return &s
}

// Render renders the files for cfg with the embedded templates.
func Render(cfg *config.Config, opts RenderOptions) (*Rendered, error) {
	r, err := NewRenderer(nil)
	if err != nil {
		return nil, err
	}
	return r.Render(cfg, opts)
}

// Summary is the part of a render that the sync plan and reload reasons
// talk about (plan.go).
type Summary struct {
	// Structure identifies the render without its replicas (a hash).
	Structure string
	// Pools maps upstream name -> "server=addr" entries in config order.
	Pools map[string][]string
}

// Tokens that may appear in nginx.conf unquoted.
var (
	// Names, header names, hosts and file paths are checked by proxyconf.Checker.
	userRe = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)
)

// Header names turnout answers with or reads from the proxy: cleared from
// client requests on their way to the replicas.
// With cfg's untrusted flow headers (contract.ClientStrip).
func clearHeaders(cfg *config.Config) []string {
	var out []string
	for _, f := range contract.VerdictFields() {
		if f.Header != "" {
			out = append(out, f.Header)
		}
	}
	return append(append(out, contract.HdrOriginalURI, contract.HdrOriginalMethod, contract.HdrBodyTruncated), config.UntrustedFlowHeaders(cfg)...)
}

// clearPatterns are what headers-more strips from every client request
// (contract.ClientStrip): turnout's verdict headers and the glue's inputs,
// whatever the suffix.
func clearPatterns(cfg *config.Config) []string {
	cs := contract.ClientStrip(cfg)
	var out []string
	for _, p := range cs.Prefixes {
		out = append(out, p+"*")
	}
	return append(out, cs.Names...)
}

// hideOnRelay are the verdict headers a relayed refusal must not carry:
// all but the refusal's own (reason, Retry-After).
var hideOnRelay = func() []string {
	g := contract.GlueVerdict()
	var out []string
	for _, f := range contract.VerdictFields() {
		if f.Header != "" && f.Name != g.Reason.Name && f.Name != g.RetryAfter.Name {
			out = append(out, f.Header)
		}
	}
	return out
}()

// quietStatuses are the 4xx statuses turnout answers a call with (the
// relayed ones and those of contract.ReasonRules) other than 401 and 403:
// auth_request logs any status but 2xx, 401 and 403 at error level
// ("auth request unexpected status"), so the header-mode call turns them
// into 403 and the glue reads the real one from $upstream_status.
func quietStatuses() []int {
	var out []int
	add := func(st int) {
		if st >= 400 && st < 500 && st != 401 && st != 403 && !slices.Contains(out, st) {
			out = append(out, st)
		}
	}
	for _, st := range contract.RelayStatuses() {
		add(st)
	}
	for _, r := range contract.ReasonRules() {
		add(r.Status)
	}
	slices.Sort(out)
	return out
}

// requestIDVar holds the request id (a map of nginx.conf.tmpl).
const requestIDVar = "$turnout_request_id"

// failReasonVar holds the X-Turnout-Reason of a fail-closed answer (a map
// of nginx.conf.tmpl).
const failReasonVar = "$turnout_fail_reason"

// errorData is an answer nginx gives itself (contract.GlueError): "add_header
// Header Reason; return Status 'Body'".
type errorData struct {
	Status               int
	Header, Reason, Body string
}

// glueError renders e for a single-quoted nginx string; reason is the
// X-Turnout-Reason value (contract.HdrReason) and stands for
// contract.ReasonToken in the body.
func glueError(e contract.GlueError, reason string) (errorData, error) {
	body := e.JSONWith(reason)
	if strings.ContainsAny(strings.Replace(body, reason, "", 1), `'\$`) {
		return errorData{}, fmt.Errorf("glue error body %q cannot go into a quoted nginx string", body)
	}
	return errorData{Status: e.Status, Header: contract.HdrReason, Reason: reason, Body: body}, nil
}

// endpointPrefix names the per-replica upstreams; pools keep
// route.PoolName so X-Turnout-Pool is an upstream name as it is.
const endpointPrefix = "turnout.ep."

type tmplData struct {
	Generator, RoutePath string
	// FeedbackFormat is the log_format of the feedback line
	// (contract.FeedbackFormat).
	FeedbackFormat string
	// FeedbackVars are the variables the feedback line's ms= and ttfb=
	// read (the table's nginx column), set by maps of the template.
	FeedbackVars struct{ Ms, TTFB, Retries, Up, Term string }
	// RequestID is the request id header and the variable that holds the
	// client's, else nginx's $request_id; Client is the client's own.
	RequestID struct{ Name, Var, Client string }
	// Hdr names the contract's request headers the config writes; Served
	// is contract.PathServed.
	Hdr struct {
		Truncated, OriginalURI, OriginalMethod, Repeat string
		// Want is contract.HdrWant; Wanted the asked verdict fields this
		// glue reads (those with a NginxVar), as its value.
		Want, Wanted string
	}
	Served string
	// HideOnRelay are the verdict headers hidden from a relayed refusal.
	HideOnRelay []string
	// QuietStatuses are turnout's 4xx answers the header-mode call hands
	// auth_request as 403 (quietRefusals).
	QuietStatuses []int
	// The answers nginx gives itself (contract.GlueError).
	NotFound, TooLarge, BadGateway, FailClosedError errorData
	Dir, PIDFile, ErrorLog, ModulePath              string
	User, Workers, Listen, JSFile                   string
	Syslog, SyslogTarget                            string
	MaxBody, WorkerConnections, Keepalive           int
	// RouteBody is how much body njs hands turnout (route_body); 0 with a
	// prefill/decode deployment, which needs all of it.
	RouteBody                 int
	ConnectMs, StreamMs       int64
	RouteTimeoutMs, CooldownS int64
	// HeaderAskMs is RouteAskTimeout: the header-mode call never runs a
	// prefill, so it does not wait RouteCallTimeout's prefill budget.
	HeaderAskMs                           int64
	RouteConnectMs                        int64
	BreakerFails, RouteTries              int
	FailClosed, HasHeader, HasBody, HasPD bool
	DefaultMode, DefaultPool              string
	// Front is TLS and the extra lines (render_front.go).
	Front        frontData
	RouteServers []routeServer
	RouteHeaders []headerData
	ModelHeaders []headerData
	ModelVars    []modelVar
	ClearHeaders []string
	// ClearPatterns are headers-more wildcards (empty without the module);
	// HeadersMorePath is its load_module path ("" = built in or unused).
	ClearPatterns   []string
	HeadersMorePath string
	// HeaderBuf sizes large_client_header_buffers (limits.max_header_bytes);
	// SubrequestBuf holds turnout's largest answer (contract.MaxAnswerBody).
	HeaderBuf, SubrequestBuf int
	// UnsafePath is contract.UnsafePathRegex; UnreadRe is contract.UnreadReasons
	// as a regex alternation.
	UnsafePath, UnreadRe string
	// AdminPath is contract.AdminPathRegex, "" with proxy.expose_admin_paths.
	AdminPath string
	// VerdictVars are the js_var variables the njs copies the verdict
	// into (contract.VerdictFields' NginxVar).
	VerdictVars []string
	// AuthVars are the auth_request_set copies of header mode: the
	// verdict's copied rows (contract.GlueVerdict) and the reason, from
	// turnout's answer headers.
	AuthVars  []authVar
	Models    []modelData
	Endpoints []endpointData
	// Targets are Endpoints with distinct addresses: the keys of the
	// address -> keepalive upstream maps.
	Targets []endpointData
	// Structure is the hash of the render without replicas (Render).
	Structure string
	Pools     []poolData
	summary   Summary

	// FirstToken: the proxying locations run the njs body filter that
	// times the first response body bytes into FirstTokenVar (a js_var),
	// with proxy.first_token_timing and feedback lines to carry it.
	FirstToken    bool
	FirstTokenVar string
}

// authVar copies the answer header of turnout's auth_request into Var:
// "auth_request_set $Var Upstream" (Upstream includes its '$').
type authVar struct{ Var, Upstream string }

type routeServer struct {
	Addr   string
	Backup bool
}

// headerData is a header name and the nginx variable that reads it in any
// '-'/'_' spelling ($http_x_session_id matches X-Session-Id and x_session_id).
type headerData struct{ Name, Var string }

// modelVar is one link of the "first model header present" chain.
type modelVar struct{ Source, Var, Next, Default string }

// modelData is one map entry; Key is already escaped for a quoted token.
type modelData struct{ Key, Pool, Mode string }

type endpointData struct{ Name, Upstream, Addr string }

type poolData struct {
	Name    string
	Servers []string
}

func buildData(cfg *config.Config, opts RenderOptions) (*tmplData, error) {
	c := proxyconf.NewChecker(ErrRender, "nginx.conf")
	bad, path, name := c.Bad, c.Path, c.Name
	addr := func(field, a string) string {
		hp, _, _ := c.Addr(field, a)
		return hp
	}
	header := func(field, h string) headerData {
		if !c.Header(field, h) {
			return headerData{}
		}
		return headerVar(h)
	}

	p := &cfg.Proxy
	d := &tmplData{
		Generator:         generator,
		RoutePath:         contract.PathRoute,
		Served:            contract.PathServed,
		HideOnRelay:       hideOnRelay,
		QuietStatuses:     quietStatuses(),
		Dir:               path("dir", opts.Dir),
		PIDFile:           path("pidfile", opts.PIDFile),
		ErrorLog:          path("error_log", opts.ErrorLog),
		Workers:           "auto",
		MaxBody:           cfg.MaxBody,
		WorkerConnections: opts.WorkerConnections,
		Keepalive:         opts.Keepalive,
		ConnectMs:         max(p.ConnectTimeout.Ms(), 1),
		StreamMs:          max(p.StreamTimeout.Ms(), 1),
		RouteTimeoutMs:    max(cfg.RouteCallTimeout().Milliseconds(), 1),
		HeaderAskMs:       max(cfg.RouteAskTimeout().Milliseconds(), 1),
		RouteConnectMs:    max(p.RouteTimeout.Ms(), 1),
		CooldownS:         max((p.BreakerCooldown.Ms()+999)/1000, 1),
		BreakerFails:      max(p.BreakerFailures, 1),
		FailClosed:        p.FailMode == config.FailClosed,
		ClearHeaders:      clearHeaders(cfg),
		HeaderBuf:         cfg.Limits.MaxHeaderBytes,
		SubrequestBuf:     2 * contract.MaxAnswerBody,
		UnsafePath:        contract.UnsafePathRegex,
		AdminPath:         contract.AdminPathRefused(cfg),
		UnreadRe:          strings.Join(contract.UnreadReasons, "|"),
		summary:           Summary{Pools: map[string][]string{}},
	}
	var wanted []string
	for _, f := range contract.VerdictFields() {
		if f.NginxVar != "" {
			d.VerdictVars = append(d.VerdictVars, f.NginxVar)
			if f.Asked {
				wanted = append(wanted, f.Name)
			}
		}
	}
	d.Hdr.Want, d.Hdr.Wanted = contract.HdrWant, strings.Join(wanted, ",")
	g := contract.GlueVerdict()
	for _, f := range g.Copied {
		if f.NginxVar != "" {
			d.AuthVars = append(d.AuthVars, authVar{f.NginxVar, headerVarName("$upstream_http_", f.Header)})
		}
	}
	d.AuthVars = append(d.AuthVars, authVar{"turnout_reason", headerVarName("$upstream_http_", g.Reason.Header)})
	d.JSFile = filepath.Join(d.Dir, JSFile)
	if opts.Workers > 0 {
		d.Workers = strconv.Itoa(opts.Workers)
	}
	if opts.User != "" {
		if !userRe.MatchString(opts.User) {
			bad("user", "%q is not a user name", opts.User)
		}
		d.User = opts.User
	}
	if opts.ModulePath != "-" {
		d.ModulePath = path("module_path", opts.ModulePath)
	}
	if opts.HeadersMore != HeadersMoreOff {
		d.ClearPatterns = clearPatterns(cfg)
		if opts.HeadersMore != "-" {
			d.HeadersMorePath = path("headers_more", opts.HeadersMore)
		}
	}
	d.Listen = addr("nginx.listen", cfg.Nginx.Listen)
	d.Front = buildFront(cfg, c)
	if cfg.Feedback.Syslog != "" {
		d.Syslog = addr("feedback.syslog", cfg.Feedback.Syslog)
		d.SyslogTarget = "syslog:server=" + d.Syslog + ",facility=local0,severity=info,tag=turnout,nohostname"
	}
	d.FeedbackFormat = contract.FeedbackFormat(cfg, func(f contract.FeedbackField) string { return f.Nginx })
	for _, f := range contract.FeedbackLineFields() {
		switch f.Key {
		case contract.FeedbackFieldMs:
			d.FeedbackVars.Ms = f.Nginx
		case contract.FeedbackFieldTTFB:
			d.FeedbackVars.TTFB = f.Nginx
		case contract.FeedbackFieldRetries:
			d.FeedbackVars.Retries = f.Nginx
		case contract.FeedbackFieldUpstream:
			d.FeedbackVars.Up = f.Nginx
		case contract.FeedbackFieldTerm:
			d.FeedbackVars.Term = f.Nginx
		}
	}
	d.Hdr.Truncated = contract.HdrBodyTruncated
	d.Hdr.OriginalURI, d.Hdr.OriginalMethod = contract.HdrOriginalURI, contract.HdrOriginalMethod
	d.Hdr.Repeat = contract.HdrRepeat
	d.RequestID.Name, d.RequestID.Var = contract.FwdRequestID, requestIDVar
	d.RequestID.Client = headerVarName("$http_", contract.FwdRequestID)
	for _, e := range []struct {
		to     *errorData
		err    contract.GlueError
		reason string
	}{
		{&d.NotFound, contract.NotFoundError, contract.NotFoundError.Reason()},
		{&d.TooLarge, contract.BodyTooLargeError(cfg.MaxBody), contract.ReasonBodyTooLarge},
		{&d.BadGateway, contract.UpstreamFailedError, contract.UpstreamFailedError.Reason()},
		{&d.FailClosedError, contract.FailClosedError, failReasonVar},
	} {
		var err error
		if *e.to, err = glueError(e.err, e.reason); err != nil {
			bad("contract", "%v", err)
		}
	}

	// turnout's addresses. A single one is listed twice: nginx never marks
	// the only server of a group down, and the breaker needs it to.
	for i, ra := range p.RouteAddrs {
		d.RouteServers = append(d.RouteServers, routeServer{Addr: addr(fmt.Sprintf("proxy.route_addrs[%d]", i), ra), Backup: i > 0})
	}
	// One try per distinct address: retrying the twin would only double
	// the wait on a turnout that does not answer.
	d.RouteTries = max(len(d.RouteServers), 1)
	switch len(d.RouteServers) {
	case 0:
		bad("proxy.route_addrs", "no address to call")
	case 1:
		d.RouteServers = append(d.RouteServers, d.RouteServers[0])
	}

	// The headers turnout gets: the same list as the HAProxy glue
	// (route/contract/forward.go); model headers also pick the pool.
	for _, h := range contract.ForwardedHeaders(cfg) {
		hd := header(h.Field, h.Name)
		if h.Name == contract.FwdRequestID {
			hd.Var = requestIDVar // the client's or nginx's own
		}
		d.RouteHeaders = append(d.RouteHeaders, hd)
	}
	for _, h := range cfg.ModelHeaders {
		if config.HeaderRe.MatchString(h) { // a bad one is reported above
			d.ModelHeaders = append(d.ModelHeaders, headerVar(h))
		}
	}
	d.ModelVars = modelChain(d.ModelHeaders)

	// Pools, replicas and models.
	upstreams := map[string]string{} // upstream name -> what claimed it
	claim := func(field, up string) {
		if other, ok := upstreams[up]; ok {
			bad(field, "upstream name %q is also used by %s", up, other)
		}
		upstreams[up] = field
	}
	claim("turnout", "turnout_route")
	modes := map[string]bool{}
	targets := map[string]bool{} // addresses in d.Targets
	for i := range cfg.Deployments {
		dep := &cfg.Deployments[i]
		f := fmt.Sprintf("deployments[%d]", i)
		name(f+".name", dep.Name)
		mode := dep.NginxMode
		if mode == "" {
			mode = cfg.Nginx.Mode
		}
		if mode != config.NginxModeHeader && mode != config.NginxModeBody {
			bad(f+".nginx_mode", "%q must be header or body", mode)
		}
		pd := dep.IsPD()
		if pd && mode != config.NginxModeBody {
			// turnout needs the whole body to run the prefill, and only njs
			// can build the decode body.
			bad(f+".nginx_mode", "prefill/decode deployment %q needs nginx_mode body", dep.Name)
		}
		modes[mode] = true
		d.HasPD = d.HasPD || pd
		var serve string // the pool that takes requests turnout is not asked about
		for j := range dep.Pools {
			pool := &dep.Pools[j]
			pf := fmt.Sprintf("%s.pools[%d]", f, j)
			pname := name(pf, config.PoolName(dep.Name, pool.Role))
			claim(pf, pname)
			if pool.Role != config.RolePrefill && serve == "" {
				serve = pname
			}
			pl := poolData{Name: pname}
			for k := range pool.Endpoints {
				e := &pool.Endpoints[k]
				ef := fmt.Sprintf("%s.endpoints[%d]", pf, k)
				a := addr(ef+".address", e.Address)
				n := name(ef+".name", e.Name)
				up := endpointPrefix + n
				claim(ef, up)
				pl.Servers = append(pl.Servers, a)
				d.Endpoints = append(d.Endpoints, endpointData{Name: n, Upstream: up, Addr: a})
				if !targets[a] {
					targets[a] = true
					d.Targets = append(d.Targets, d.Endpoints[len(d.Endpoints)-1])
				}
				d.summary.Pools[pname] = append(d.summary.Pools[pname], n+"="+a)
			}
			if _, ok := d.summary.Pools[pname]; !ok {
				d.summary.Pools[pname] = nil
			}
			d.Pools = append(d.Pools, pl)
		}
		if d.DefaultPool == "" {
			d.DefaultPool = serve
			d.DefaultMode = mode
		}
		for _, m := range dep.Models {
			key, ok := mapKey(m)
			if !ok {
				// Left to the defaults: the map cannot hold the name safely.
				continue
			}
			d.Models = append(d.Models, modelData{Key: key, Pool: serve, Mode: mode})
		}
	}
	if len(d.Pools) == 0 {
		bad("deployments", "no pool to render")
	}
	d.HasHeader = modes[config.NginxModeHeader]
	d.HasBody = modes[config.NginxModeBody]
	// Without a model header the body decides, which only njs can read.
	if d.HasBody {
		d.DefaultMode = config.NginxModeBody
	}
	d.FirstToken = cfg.Proxy.FirstTokenTimed() && d.Syslog != ""
	d.FirstTokenVar = contract.FirstTokenNginxVar
	if !d.HasBody && !d.FirstToken {
		d.ModulePath = ""
	}
	if !d.HasPD {
		d.RouteBody = cfg.RouteBody
	}
	return d, c.Err()
}

// headerVar names the nginx variable of request header h.
func headerVar(h string) headerData {
	return headerData{Name: h, Var: headerVarName("$http_", h)}
}

// headerVarName is nginx's variable for header h under prefix ($http_ for
// a request header, $upstream_http_ for an upstream answer's).
func headerVarName(prefix, h string) string {
	return prefix + strings.ToLower(strings.ReplaceAll(h, "-", "_"))
}

// modelChain builds the maps that set $turnout_model to the first model
// header present: each link falls through to the next on an empty value.
func modelChain(hs []headerData) []modelVar {
	if len(hs) == 0 {
		// $host is always set; the map only provides an empty $turnout_model.
		return []modelVar{{Source: "$host", Var: "$turnout_model", Default: `""`}}
	}
	out := make([]modelVar, len(hs))
	for i, h := range hs {
		v := "$turnout_model"
		if i > 0 {
			v = fmt.Sprintf("$turnout_model_%d", i)
		}
		out[i] = modelVar{Source: h.Var, Var: v, Default: h.Var}
	}
	for i := range len(out) - 1 {
		out[i].Next = out[i+1].Var
	}
	return out
}

// mapKey escapes a model name for a double-quoted map key written as
// "\\KEY": nginx drops the leading backslash, so names such as "default",
// "include" or "~regex" stay literal. Only printable ASCII is accepted
// (header values, which the map matches, are ASCII in practice); quotes and
// backslashes are escaped.
func mapKey(m string) (string, bool) {
	if m == "" || len(m) > 256 {
		return "", false
	}
	var b strings.Builder
	for i := range len(m) {
		c := m[i]
		if c < 0x20 || c > 0x7e {
			return "", false
		}
		if c == '"' || c == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(c)
	}
	return b.String(), true
}
