// Package haproxy renders turnout's HAProxy setup (haproxy.cfg, the Lua glue
// and a model map) and keeps a running HAProxy's server pools in line with
// turnout's config over the runtime API, reloading only for structural
// changes.
//
//   - render.go: config -> files, from the embedded templates (no I/O).
//   - plan.go:   pure Diff of desired vs live state -> runtime commands or a reload.
//   - sync.go:   the Syncer that reads the live state, applies a plan and rewrites the files.
package haproxy

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"regexp"
	"strings"
	"text/template"
	"time"

	"github.com/turnout/turnout/internal/config"

	"github.com/turnout/turnout/internal/proxyconf"
	"github.com/turnout/turnout/route/contract"
)

// File names inside the rendered directory.
const (
	ConfigFile = "haproxy.cfg"
	LuaFile    = "turnout.lua"
	MapFile    = "models.map"
	// SPOEFile is the SPOE engine config (haproxy.spoe only).
	SPOEFile = "turnout-spoe.conf"

	configTemplate = "templates/haproxy.cfg.tmpl"
	spoeTemplate   = "templates/haproxy-spoe.snippets.tmpl"
	luaTemplate    = "lua/turnout.lua.tmpl"

	// structureMarker starts the header line that carries the structure hash.
	structureMarker = "# turnout-structure "
	generator       = "turnout render haproxy"
)

// ErrRender marks config values that cannot be rendered safely.
var ErrRender = errors.New("haproxy render")

// Defaults for paths derived from the output directory.
const (
	DefaultSocketName  = "admin.sock"
	DefaultPIDFileName = "haproxy.pid"
	// RouteSocketName is the unix socket of the local hop to turnout.
	RouteSocketName = "route.sock"
	// RouteProxy is the listen section of that hop.
	RouteProxy = "turnout_route"
	// RoutePDSocketName and RoutePDProxy are the hop of the Lua's second
	// call for a prefill/decode request, whose timeout covers the prefill.
	RoutePDSocketName = "route-pd.sock"
	RoutePDProxy      = "turnout_route_pd"
	// SPOEProxy is the SPOE agent's backend (haproxy.spoe).
	SPOEProxy = "turnout_spoe"
	// SPOERelayProxy answers what the agent says to relay (a refusal).
	SPOERelayProxy = "turnout_relay"
	// SPOESocketName is the agent's default unix socket in the rendered
	// directory (haproxy.path spoe without haproxy.spoe).
	SPOESocketName = "spoe.sock"
)

// SPOEAddr is where turnout's SPOE agent listens for the HAProxy rendered
// into dir: haproxy.spoe, else with haproxy.path spoe the unix socket
// dir/spoe.sock ("unix@/path"); "" when HAProxy takes the Lua path or no
// directory is known. turnout serve and the renderer both use it, so they
// agree on the address.
func SPOEAddr(cfg *config.Config, dir string) string {
	if cfg.HAProxy.Path != config.HAProxyPathSPOE {
		return cfg.HAProxy.SPOE
	}
	if cfg.HAProxy.SPOE != "" || dir == "" {
		return cfg.HAProxy.SPOE
	}
	return "unix@" + filepath.Join(dir, SPOESocketName)
}

// RenderOptions says where the rendered files will live; haproxy.cfg refers
// to the Lua, the map, the socket and the pidfile by absolute path.
type RenderOptions struct {
	// Dir is the absolute directory the files are written to.
	Dir string
	// Socket is the admin stats socket (default: cfg haproxy.stats_socket, else Dir/admin.sock).
	Socket string
	// PIDFile receives the master pid (default Dir/haproxy.pid).
	PIDFile string
}

// withDefaults fills the options from the config and Dir.
func (o RenderOptions) withDefaults(cfg *config.Config) RenderOptions {
	o.Dir = cmp.Or(o.Dir, cfg.HAProxy.Dir)
	o.Socket = cmp.Or(o.Socket, cfg.HAProxy.StatsSocket)
	proxyconf.InDir(&o.Socket, o.Dir, DefaultSocketName)
	proxyconf.InDir(&o.PIDFile, o.Dir, DefaultPIDFileName)
	return o
}

// Rendered is one rendered HAProxy setup.
type Rendered struct {
	Config []byte
	Lua    []byte
	Map    []byte
	// SPOE is the SPOE engine file (haproxy.spoe only).
	SPOE []byte
	// State is what the live HAProxy should look like once this is applied.
	State State
	// Secret: Config holds the feedback token (written 0600).
	Secret bool
}

// File is one output file.
type File = proxyconf.File

// Files lists the output files in write order (the config last, so a reload
// racing a rewrite never sees a config pointing at a missing Lua file).
func (r *Rendered) Files() []File {
	files := []File{{Name: LuaFile, Data: r.Lua}, {Name: MapFile, Data: r.Map}}
	if r.SPOE != nil {
		files = append(files, File{Name: SPOEFile, Data: r.SPOE})
	}
	return append(files, File{Name: ConfigFile, Data: r.Config, Private: r.Secret})
}

// Renderer turns a turnout config into HAProxy files.
type Renderer struct {
	cfg, lua *template.Template
}

// NewRenderer parses the templates from fsys (turnout.Assets when nil).
func NewRenderer(fsys fs.FS) (*Renderer, error) {
	c, err := proxyconf.ParseTemplates(fsys, "haproxy.cfg.tmpl", configTemplate, spoeTemplate)
	if err != nil {
		return nil, err
	}
	l, err := proxyconf.ParseTemplates(fsys, "turnout.lua.tmpl", luaTemplate)
	if err != nil {
		return nil, err
	}
	return &Renderer{cfg: c, lua: l}, nil
}

// Render renders the files for cfg with the embedded templates.
func Render(cfg *config.Config, opts RenderOptions) (*Rendered, error) {
	r, err := NewRenderer(nil)
	if err != nil {
		return nil, err
	}
	return r.Render(cfg, opts)
}

// Render renders cfg. Every config value that reaches a file is checked
// again here (config.Config.Validate already restricts names), so no value can
// add a line or a keyword to haproxy.cfg or code to the Lua.
func (r *Renderer) Render(cfg *config.Config, opts RenderOptions) (*Rendered, error) {
	opts = opts.withDefaults(cfg)
	d, err := buildData(cfg, opts)
	if err != nil {
		return nil, err
	}
	// The structure hash covers everything a runtime change cannot touch:
	// the same render with no server lines, plus the Lua and the model map.
	var lua bytes.Buffer
	if err := r.lua.Execute(&lua, d.lua); err != nil {
		return nil, fmt.Errorf("render %s: %w", LuaFile, err)
	}
	bare := *d
	bare.Backends = make([]backendData, len(d.Backends))
	for i, b := range d.Backends {
		b.Servers = nil
		bare.Backends[i] = b
	}
	var skeleton bytes.Buffer
	if err := r.cfg.Execute(&skeleton, &bare); err != nil {
		return nil, fmt.Errorf("render %s: %w", ConfigFile, err)
	}
	var spoeConf []byte
	if d.SPOE != nil {
		var b bytes.Buffer
		if err := r.cfg.ExecuteTemplate(&b, "spoe-conf", d); err != nil {
			return nil, fmt.Errorf("render %s: %w", SPOEFile, err)
		}
		spoeConf = b.Bytes()
	}
	h := sha256.New()
	h.Write(skeleton.Bytes())
	h.Write(lua.Bytes())
	h.Write(d.modelMap)
	h.Write(spoeConf)
	d.Structure = hex.EncodeToString(h.Sum(nil))[:16]

	var conf bytes.Buffer
	if err := r.cfg.Execute(&conf, d); err != nil {
		return nil, fmt.Errorf("render %s: %w", ConfigFile, err)
	}
	return &Rendered{Config: conf.Bytes(), Lua: lua.Bytes(), Map: d.modelMap, SPOE: spoeConf, State: d.state(), Secret: cfg.Feedback.LineToken() != ""}, nil
}

// Check renders cfg into a scratch directory (so paths inside point there)
// and runs "haproxy -c" on it. The real files are untouched.
func (r *Renderer) Check(ctx context.Context, haproxyBin string, cfg *config.Config, opts RenderOptions) error {
	if err := CheckFiles(cfg); err != nil {
		return err
	}
	return proxyconf.CheckRender("turnout-haproxy-check-", func(tmp string) (*Rendered, error) {
		opts.Dir, opts.Socket, opts.PIDFile = tmp, filepath.Join(tmp, DefaultSocketName), filepath.Join(tmp, DefaultPIDFileName)
		if cfg.HAProxy.Chroot != "" {
			// The scratch directory is the chroot of the scratch render,
			// so its sockets are inside it as the real ones are.
			c := *cfg
			c.HAProxy.Chroot = tmp
			return r.Render(&c, opts)
		}
		return r.Render(cfg, opts)
	}, func(tmp string) error { return CheckFile(ctx, haproxyBin, filepath.Join(tmp, ConfigFile)) })
}

// CheckFile runs "haproxy -c -f path" and returns its output on failure.
func CheckFile(ctx context.Context, haproxyBin, path string) error {
	return proxyconf.RunCheck(ctx, ErrRender, "haproxy -c", haproxyBin, "-c", "-q", "-f", path)
}

// StructureOf returns the structure hash recorded in a rendered haproxy.cfg
// ("" when the file was not rendered by turnout).
func StructureOf(config []byte) string {
	for range 3 { // the marker is on the second line
		line, rest, _ := bytes.Cut(config, []byte{'\n'})
		if v, ok := bytes.CutPrefix(line, []byte(structureMarker)); ok {
			return string(bytes.TrimSpace(v))
		}
		config = rest
	}
	return ""
}

// ServerParams are the keywords every turnout-managed server gets, in the
// file and in runtime "add server" alike, so a reload changes nothing.
func ServerParams(cfg *config.Config) string {
	inter := cfg.Health.Interval.D()
	if inter <= 0 {
		inter = 2 * time.Second
	}
	fall := max(cfg.Health.Fails, 1)
	return fmt.Sprintf("check inter %dms fall %d rise 1", inter.Milliseconds(), fall)
}

// Tokens that may appear in haproxy.cfg. Names must be HAProxy identifiers;
// addresses and paths must not carry spaces, quotes or comment characters.
var (
	// Names, header names, hosts and file paths are checked by proxyconf.Checker.
	httpRe = regexp.MustCompile(`^/[A-Za-z0-9_./~%-]*$`)
	// mapKeyRe: map files split keys on whitespace and treat '#' lines as
	// comments; models outside this set are left to the default backend.
	mapKeyRe = regexp.MustCompile(`^[!-"$-~][!-~]{0,255}$`)
)

type tmplData struct {
	Generator, Structure, RoutePath string
	// UnsafePath is contract.UnsafePathRegex, refused before the Served
	// guard (contract.PathServed); Internal is contract.PathInternal.
	UnsafePath, Served, Internal string
	// AdminPath is contract.AdminPathRegex, "" with proxy.expose_admin_paths.
	AdminPath string
	// FeedbackFormat is the log-format of the feedback line
	// (contract.FeedbackFormat).
	FeedbackFormat string
	// StripPrefixes (regexes, lower case) and StripNames are the client
	// headers deleted first (contract.ClientStrip).
	StripPrefixes, StripNames []string
	// RequestID is the request id header (contract.FwdRequestID), set
	// when the client sent none.
	RequestID string
	// NotFound is the answer to a path that is not served.
	NotFound                                 errorData
	Dir, Socket, PIDFile, Listen, Syslog     string
	HealthPath, DefaultBackend, ServerParams string
	RouteHealthPath                          string
	RoutePDProxy, RoutePDSocket              string
	RouteTimeoutMs                           int64
	// RoutePDTimeoutMs bounds the Lua's second call of a prefill/decode
	// request (turnout_route_pd): the decision runs the prefill.
	RoutePDTimeoutMs                             int64
	RouteConnectMs                               int64
	RouteRetries                                 int
	RouteServers                                 []routeServer
	MaxConn, Nbthread, MaxBody, BufSize, Retries int
	RouteBody                                    int
	L7Retries                                    bool
	// FeedbackRing: the feedback lines go through a ring forwarded over
	// TCP (haproxy.feedback: ring), not one UDP datagram each.
	FeedbackRing bool
	// SPOE is set when HAProxy asks turnout over SPOE (haproxy.spoe).
	SPOE                                *spoeData
	ConnectMs, StreamMs, CheckTimeoutMs int64
	ModelMap                            bool
	PD                                  bool // a deployment disaggregates prefill and decode
	// ServerVars: the chosen server's variable, then the fallbacks';
	// PoolVar the chosen backend's.
	ServerVars []string
	PoolVar    string
	Backends   []backendData

	// FirstToken: the frontend times the first response body bytes into
	// FirstTokenVar (proxy.first_token_timing).
	FirstToken    bool
	FirstTokenVar string

	// Front is TLS, worker user/chroot and the extra lines (render_front.go).
	Front frontData

	lua      luaData
	modelMap []byte
}

// spoeData fills templates/haproxy-spoe.snippets.tmpl.
type spoeData struct {
	Backend                              string // SPOEProxy
	RelayBackend                         string // SPOERelayProxy
	Conf                                 string
	Servers                              []routeServer
	HelloMs, IdleMs, ServerMs, TimeoutMs int64
	PDTimeoutMs                          int64
	// BreakerFails timeouts in a row stop asking the agent for CooldownMs.
	BreakerFails, CooldownMs int64
	PDVar, DeferArg, SentArg string
	FailClosed               bool
	Fallbacks, Vars          []string
	Contract                 contract.SPOEConfig
	BodyRoom                 int
	MaxFrameSize             int
}

// errorData is an answer HAProxy gives itself (contract.GlueError):
// "http-request return status Status ... string 'Body' hdr Header Reason".
type errorData struct {
	Status               int
	Header, Reason, Body string
}

// glueError renders e for a single-quoted HAProxy string.
func glueError(e contract.GlueError) (errorData, error) {
	body := e.JSON()
	if strings.ContainsAny(body, `'%\`) {
		return errorData{}, fmt.Errorf("glue error body %q cannot go into a quoted HAProxy string", body)
	}
	return errorData{Status: e.Status, Header: strings.ToLower(contract.HdrReason), Reason: e.Reason(), Body: body}, nil
}

type routeServer struct {
	Name, Addr string
	Backup     bool
}

type backendData struct {
	Name string
	// Prefill marks a prefill pool: turnout calls its replicas itself and
	// never names it in a verdict, so it gets no use-server rules.
	Prefill bool
	// KVFilter marks a PD decode pool: its backend runs the Lua filter that
	// inserts kv_transfer_params into the request body.
	KVFilter bool
	Servers  []serverData
}

type serverData struct {
	Name, Addr, Host string
	Port             int
	// Drain: the endpoint is draining (set over the runtime API, not in the file).
	Drain bool
}

// luaData holds ready-made Lua literals (already quoted).
type luaData struct {
	Generator, RoutePath string
	RouteURL, RouteDst   string
	// RouteDstPD is the prefill/decode hop's socket (quoted), or nil.
	RouteDstPD                          string
	TimeoutMs, BreakerFails, CooldownMs int64
	FailClosed                          bool
	Headers                             []luaHeader
	FallbackVars                        []string
	// BodyRoom bounds a decode body with kv_transfer_params inserted: what
	// tune.bufsize holds besides the request line and headers.
	BodyRoom int
	// RouteBody is how much body the action sends turnout (route_body);
	// 0 with prefill/decode, which needs all of it.
	RouteBody int
	// Contract is the glue contract as Lua literals (contract_lua.go).
	Contract luaContract
}

type luaHeader struct {
	Name      string
	Spellings []string
}

func (d *tmplData) state() State {
	s := State{Structure: d.Structure, Backends: make(map[string][]Server, len(d.Backends))}
	for _, b := range d.Backends {
		srvs := make([]Server, 0, len(b.Servers))
		for _, sv := range b.Servers {
			srvs = append(srvs, Server{Name: sv.Name, Host: sv.Host, Port: sv.Port, Drain: sv.Drain})
		}
		s.Backends[b.Name] = srvs
	}
	s.Params = d.ServerParams
	return s
}

func buildData(cfg *config.Config, opts RenderOptions) (*tmplData, error) {
	c := proxyconf.NewChecker(ErrRender, "HAProxy")
	bad, path, addr, name := c.Bad, c.Path, c.Addr, c.Name

	p := &cfg.Proxy
	d := &tmplData{
		Generator:      generator,
		RoutePath:      contract.PathRoute,
		UnsafePath:     contract.UnsafePathRegex,
		AdminPath:      contract.AdminPathRefused(cfg),
		Served:         contract.PathServed,
		Internal:       contract.PathInternal,
		Dir:            path("dir", opts.Dir),
		Socket:         path("socket", opts.Socket),
		PIDFile:        path("pidfile", opts.PIDFile),
		MaxConn:        max(cfg.HAProxy.MaxConn, 1),
		Nbthread:       max(cfg.HAProxy.Nbthread, 0),
		MaxBody:        cfg.MaxBody,
		RouteBody:      cfg.RouteBody,
		BufSize:        RouteBodyBufSize(cfg.RouteBody),
		Retries:        max(cfg.Fallbacks, 1),
		L7Retries:      cfg.HAProxy.L7Retries,
		ConnectMs:      max(p.ConnectTimeout.Ms(), 1),
		StreamMs:       max(p.StreamTimeout.Ms(), 1),
		CheckTimeoutMs: max(cfg.Health.Timeout.Ms(), 1),
		ServerParams:   ServerParams(cfg),
	}
	d.Listen, _, _ = addr("haproxy.listen", cfg.HAProxy.Listen)
	d.Front = buildFront(cfg, c)
	if cfg.Feedback.Syslog != "" {
		d.Syslog, _, _ = addr("feedback.syslog", cfg.Feedback.Syslog)
		d.FeedbackRing = cfg.HAProxy.Feedback == config.HAProxyFeedbackRing
		// The timer's figure travels in the feedback line only.
		d.FirstToken = cfg.Proxy.FirstTokenTimed()
		d.FirstTokenVar = contract.FirstTokenHAProxyVar
	}
	d.FeedbackFormat = contract.FeedbackFormat(cfg, func(f contract.FeedbackField) string { return f.HAProxy })
	cs := contract.ClientStrip(cfg)
	for _, p := range cs.Prefixes {
		d.StripPrefixes = append(d.StripPrefixes, "^"+regexp.QuoteMeta(strings.ToLower(p)))
	}
	for _, n := range cs.Names {
		d.StripNames = append(d.StripNames, strings.ToLower(n))
	}
	d.RequestID = contract.FwdRequestID
	var err error
	if d.NotFound, err = glueError(contract.NotFoundError); err != nil {
		bad("contract", "%v", err)
	}
	if !httpRe.MatchString(cfg.Health.Path) {
		bad("health.path", "%q must be a plain absolute path", cfg.Health.Path)
	}
	d.HealthPath = cfg.Health.Path

	// Variables for use-server: the chosen server, then the fallbacks.
	fallbacks := min(max(cfg.Fallbacks, 0), 8)
	d.ServerVars = []string{contract.VerdictFieldNamed("server").HAProxyVar}
	for i := 1; i <= fallbacks; i++ {
		d.ServerVars = append(d.ServerVars, fmt.Sprintf("%s%d", contract.VerdictFieldNamed("fallbacks").HAProxyVar, i))
	}
	d.PoolVar = contract.VerdictFieldNamed("pool").HAProxyVar

	var mapBuf bytes.Buffer
	seen := map[string]bool{}
	for i := range cfg.Deployments {
		dep := &cfg.Deployments[i]
		name(fmt.Sprintf("deployments[%d].name", i), dep.Name)
		pd := dep.IsPD()
		d.PD = d.PD || pd
		// The pool that takes requests when turnout is away: for PD the
		// decode pool, which then serves aggregated (prefill and decode on
		// one replica) because no kv_transfer_params come with the body.
		var serve string
		for j := range dep.Pools {
			pool := &dep.Pools[j]
			bname := name(fmt.Sprintf("deployments[%d].pools[%d]", i, j), config.PoolName(dep.Name, pool.Role))
			if seen[bname] {
				bad(fmt.Sprintf("deployments[%d].pools[%d]", i, j), "backend %q appears twice", bname)
			}
			seen[bname] = true
			if pool.Role != config.RolePrefill && serve == "" {
				serve = bname
			}
			b := backendData{Name: bname, Prefill: pool.Role == config.RolePrefill, KVFilter: pd && pool.Role == config.RoleDecode}
			for k := range pool.Endpoints {
				e := &pool.Endpoints[k]
				f := fmt.Sprintf("deployments[%d].pools[%d].endpoints[%d]", i, j, k)
				a, host, port := addr(f+".address", e.Address)
				b.Servers = append(b.Servers, serverData{Name: name(f+".name", e.Name), Addr: a, Host: host, Port: port, Drain: e.Draining})
			}
			d.Backends = append(d.Backends, b)
		}
		if serve == "" && len(dep.Pools) > 0 {
			serve = config.PoolName(dep.Name, dep.Pools[0].Role)
		}
		if d.DefaultBackend == "" {
			d.DefaultBackend = serve
		}
		for _, m := range dep.Models {
			if mapKeyRe.MatchString(m) {
				fmt.Fprintf(&mapBuf, "%s %s\n", m, serve)
			}
		}
	}
	if len(d.Backends) == 0 {
		bad("deployments", "no pool to render")
	}
	d.ModelMap = len(cfg.Deployments) > 1
	d.modelMap = mapBuf.Bytes()
	if d.PD {
		d.BufSize = WholeBodyBufSize(cfg.MaxBody)
	}

	// The Lua side.
	l := luaData{
		Generator:    generator,
		RoutePath:    contract.PathRoute,
		TimeoutMs:    max(cfg.RouteCallTimeout().Milliseconds(), 1),
		BreakerFails: int64(max(p.BreakerFailures, 1)),
		CooldownMs:   max(p.BreakerCooldown.Ms(), 1),
		FailClosed:   p.FailMode == config.FailClosed,
		BodyRoom:     d.BufSize - headerRoom,
	}
	if !d.PD {
		l.RouteBody = cfg.RouteBody
	}
	l.Contract = newLuaContract()
	// The Lua calls the turnout_route hop; its servers are the route addresses.
	l.RouteURL = luaQuote("http://turnout" + contract.PathRoute)
	// The worker connects to these sockets after any chroot: the paths are
	// the ones it sees there (the master binds them before).
	routeSock, ok := inChroot(d.Front.Chroot, filepath.Join(d.Dir, RouteSocketName))
	if !ok && cfg.HAProxy.Path == config.HAProxyPathLua {
		bad("haproxy.chroot", "the Lua action's socket %s is outside the chroot %s: render into a directory inside it", routeSock, d.Front.Chroot)
	}
	l.RouteDst = luaQuote("unix@" + routeSock)
	l.RouteDstPD = "nil"
	if d.PD {
		pdSock, _ := inChroot(d.Front.Chroot, filepath.Join(d.Dir, RoutePDSocketName))
		l.RouteDstPD = luaQuote("unix@" + pdSock)
	}
	d.RouteHealthPath = contract.PathHealthz
	d.RoutePDProxy, d.RoutePDSocket = RoutePDProxy, RoutePDSocketName
	// The first call never runs a prefill (contract.HdrDeferPD): route_timeout
	// bounds it; the prefill/decode hop waits as long as the prefill may.
	d.RouteTimeoutMs = max(cfg.RouteAskTimeout().Milliseconds(), 1)
	d.RoutePDTimeoutMs = l.TimeoutMs
	d.RouteConnectMs = max(p.RouteTimeout.Ms(), 1)
	for i, ra := range p.RouteAddrs {
		a, _, _ := addr(fmt.Sprintf("proxy.route_addrs[%d]", i), ra)
		d.RouteServers = append(d.RouteServers, routeServer{Name: fmt.Sprintf("route%d", i), Addr: a, Backup: i > 0})
	}
	if len(d.RouteServers) == 0 {
		bad("proxy.route_addrs", "no address to call")
	}
	// One retry per standby; a refused connect then moves on at once.
	d.RouteRetries = len(d.RouteServers) - 1
	if cfg.HAProxy.Path == config.HAProxyPathSPOE {
		var a string
		if sock, ok := strings.CutPrefix(SPOEAddr(cfg, d.Dir), "unix@"); ok {
			seen, inside := inChroot(d.Front.Chroot, path("haproxy.spoe", sock))
			if !inside {
				bad("haproxy.chroot", "the SPOE agent's socket %s is outside the chroot %s: render into a directory inside it, or set haproxy.spoe to host:port", sock, d.Front.Chroot)
			}
			a = "unix@" + seen
			if len(sock) > maxUnixPath {
				bad("haproxy.spoe", "the agent socket %q is longer than a unix socket path may be (%d bytes): set haproxy.spoe to host:port or render to a shorter directory", sock, maxUnixPath)
			}
		} else {
			a, _, _ = addr("haproxy.spoe", cfg.HAProxy.SPOE)
		}
		d.SPOE = &spoeData{
			Backend:      SPOEProxy,
			RelayBackend: SPOERelayProxy,
			Conf:         path("spoe conf", filepath.Join(d.Dir, SPOEFile)),
			Servers:      []routeServer{{Name: "agent0", Addr: a}},
			// The agent connection idles while flow control holds
			// its frames: it must outlast the longest hold.
			HelloMs: 500, IdleMs: 30000, ServerMs: max(60000, l.TimeoutMs+1000),
			// The first call never waits on a prefill (route/spoe): it
			// is bounded by route_timeout (and a flow-control hold); the
			// second agent's by the prefill.
			TimeoutMs:    max(cfg.RouteAskTimeout().Milliseconds(), 1),
			PDTimeoutMs:  l.TimeoutMs,
			BreakerFails: l.BreakerFails,
			CooldownMs:   l.CooldownMs,
			PDVar:        contract.SPOEVarPD,
			DeferArg:     contract.SPOEArgDeferPD,
			SentArg:      contract.SPOEArgSent,
			FailClosed:   p.FailMode == config.FailClosed,
			Fallbacks:    contract.SPOEFallbackVars(cfg.Fallbacks),
			Vars:         contract.SPOEVarNames(cfg.Fallbacks),
			BodyRoom:     l.BodyRoom,
		}
		sc, err := contract.NewSPOEConfig()
		if err != nil {
			bad("haproxy.spoe", "%v", err)
		}
		d.SPOE.Contract = sc
	}
	hdr := func(field, h string) {
		if !c.Header(field, h) {
			return
		}
		lh := luaHeader{Name: luaQuote(strings.ToLower(h))}
		for _, s := range spellings(strings.ToLower(h)) {
			lh.Spellings = append(lh.Spellings, luaQuote(s))
		}
		l.Headers = append(l.Headers, lh)
	}
	// The same list the SPOE agent forwards (route/contract/forward.go).
	for _, h := range contract.ForwardedHeaders(cfg) {
		hdr(h.Field, h.Name)
	}
	for _, v := range d.ServerVars[1:] {
		l.FallbackVars = append(l.FallbackVars, luaQuote(v))
	}
	d.lua = l
	return d, c.Err()
}

// maxUnixPath is the longest unix socket path Linux binds (sun_path less
// its terminating NUL).
const maxUnixPath = 107

// headerRoom is the part of tune.bufsize kept for the request line and headers.
const headerRoom = 16 << 10

// bufSize is tune.bufsize: the body limit plus room for headers, on a 4 KiB
// boundary. Memory is about two buffers per connection.
func bufSize(maxBody int) int {
	n := max(maxBody, 1024) + headerRoom
	return (n + 4095) &^ 4095
}

// RouteBodyBufSize is tune.bufsize without a prefill/decode deployment:
// route_body plus headers.
func RouteBodyBufSize(routeBody int) int { return bufSize(routeBody) }

// WholeBodyBufSize is tune.bufsize with a prefill/decode deployment: a
// whole max_body body, plus what the decode body gains by the prefill's
// kv_transfer_params (the filter rewrites it in one buffer), plus headers.
func WholeBodyBufSize(maxBody int) int { return bufSize(maxBody + kvRoom(maxBody)) }

// kvRoom is how much a decode body may grow by kv_transfer_params. Their
// size is dominated by remote_block_ids: one id (up to ~8 bytes with the
// comma) per KV block of 16 tokens, and a prompt rarely has more than one
// token per 2 bytes of JSON, so a quarter of max_body covers it; the 4 KiB
// are the fixed fields (engine id, host, port).
func kvRoom(maxBody int) int { return maxBody/4 + 4<<10 }

// maxSpellings caps the '-'/'_' variants per header (2^separators).
const maxSpellings = 64

// spellings lists every '-'/'_' spelling of a lowercase header name, so the
// Lua matches x-session-id, x_session_id and x_session-id with table lookups
// instead of normalizing every request header. Beyond maxSpellings only the
// all-dash and all-underscore forms are listed.
func spellings(h string) []string {
	var seps []int
	for i := range len(h) {
		if h[i] == '-' || h[i] == '_' {
			seps = append(seps, i)
		}
	}
	if 1<<len(seps) > maxSpellings {
		return []string{strings.ReplaceAll(h, "_", "-"), strings.ReplaceAll(h, "-", "_")}
	}
	out := make([]string, 0, 1<<len(seps))
	b := []byte(h)
	for mask := range 1 << len(seps) {
		for k, pos := range seps {
			if mask&(1<<k) != 0 {
				b[pos] = '_'
			} else {
				b[pos] = '-'
			}
		}
		out = append(out, string(b))
	}
	return out
}

// luaQuote returns s as a double-quoted Lua string literal; anything outside
// printable ASCII, quotes and backslashes become decimal escapes.
func luaQuote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := range len(s) {
		c := s[i]
		if c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			fmt.Fprintf(&b, "\\%03d", c)
			continue
		}
		b.WriteByte(c)
	}
	b.WriteByte('"')
	return b.String()
}
