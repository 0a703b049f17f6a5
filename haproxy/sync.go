package haproxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/turnout/turnout/internal/config"

	"github.com/haproxytech/client-native/v5/runtime"
	"github.com/haproxytech/client-native/v5/runtime/options"
	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/proxyconf"
)

// Log field names.
const (
	fieldBackend = "backend"
	fieldServer  = "server"
	fieldReason  = "reason"
	fieldCmd     = "cmd"
	fieldDir     = "dir"
	fieldPID     = "pid"
)

// ErrNoHAProxy reports that the runtime socket did not answer.
var ErrNoHAProxy = errors.New("haproxy runtime socket unreachable")

// SyncOptions configure a Syncer. Empty fields come from the config's
// haproxy section at each Sync.
type SyncOptions struct {
	// Socket is the admin stats socket (default haproxy.stats_socket, else Dir/admin.sock).
	Socket string
	// Dir holds haproxy.cfg, turnout.lua and models.map (default haproxy.dir).
	Dir string
	// PIDFile holds the master pid for SIGUSR2 reloads (default Dir/haproxy.pid).
	PIDFile string
	// DrainTimeout bounds the wait for a removed server's sessions (default haproxy.drain_timeout).
	DrainTimeout time.Duration
	// HAProxyBin checks each new config with "haproxy -c" before it is
	// written ("" = look up "haproxy" in PATH, "-" = do not check).
	HAProxyBin string
	// ReloadTimeout bounds the wait for the new worker after a reload (default 15s).
	ReloadTimeout time.Duration
	// PollInterval is how often drains and reloads are polled (default 100ms).
	PollInterval time.Duration

	// dial opens the runtime API; tests replace it.
	dial func(ctx context.Context, socket string) (RuntimeClient, error)
}

// RuntimeClient is the part of client-native's runtime.Runtime a sync uses.
type RuntimeClient interface {
	ExecuteRaw(command string) ([]string, error)
	AddServer(backend, name, attributes string) error
	DeleteServer(backend, name string) error
	SetServerAddr(backend, server, ip string, port int) error
	EnableServer(backend, server string) error
	EnableServerHealth(backend, server string) error
	DisableServer(backend, server string) error
}

var _ RuntimeClient = runtime.Runtime(nil)

// Syncer keeps one HAProxy in line with turnout's config.
type Syncer struct {
	opts SyncOptions
	log  *zerolog.Logger
	r    *Renderer
	mu   sync.Mutex // one Sync at a time
	// reach logs when HAProxy answers after a sync found it unreachable.
	reach proxyconf.UpWatch
}

// NewSyncer prepares a Syncer; it does not touch HAProxy yet.
func NewSyncer(opts SyncOptions, log *zerolog.Logger) (*Syncer, error) {
	proxyconf.SyncDefaults{Bin: &opts.HAProxyBin, ReloadTimeout: &opts.ReloadTimeout, PollInterval: &opts.PollInterval}.
		Fill("haproxy", 100*time.Millisecond)
	if opts.dial == nil {
		opts.dial = dialRuntime
	}
	for _, p := range []*string{&opts.Dir, &opts.Socket, &opts.PIDFile} {
		if *p != "" {
			abs, err := filepath.Abs(*p)
			if err != nil {
				return nil, fmt.Errorf("haproxy sync: %w", err)
			}
			*p = abs
		}
	}
	r, err := NewRenderer(nil)
	if err != nil {
		return nil, err
	}
	return &Syncer{opts: opts, log: proxyconf.Logger(log), r: r}, nil
}

func dialRuntime(ctx context.Context, socket string) (RuntimeClient, error) {
	c, err := runtime.New(ctx, options.Socket(socket))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrNoHAProxy, socket, err)
	}
	return c, nil
}

// resolved is SyncOptions with the config's defaults filled in.
type resolved struct {
	render RenderOptions
	drain  time.Duration
}

func (s *Syncer) resolve(cfg *config.Config) (resolved, error) {
	ro := RenderOptions{Dir: s.opts.Dir, Socket: s.opts.Socket, PIDFile: s.opts.PIDFile}.withDefaults(cfg)
	if ro.Dir == "" {
		return resolved{}, fmt.Errorf("haproxy sync: no directory (set --haproxy-dir or haproxy.dir)")
	}
	// haproxy.cfg refers to its files by absolute path.
	for _, p := range []*string{&ro.Dir, &ro.Socket, &ro.PIDFile} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			return resolved{}, fmt.Errorf("haproxy sync: %w", err)
		}
		*p = abs
	}
	drain := s.opts.DrainTimeout
	if drain <= 0 {
		drain = cfg.HAProxy.DrainTimeout.D()
	}
	return resolved{render: ro, drain: drain}, nil
}

// Sync renders cfg, plans against the live HAProxy, applies the plan over the
// runtime socket and rewrites the files. It reloads (SIGUSR2 to the master)
// only for structural changes or when a runtime change failed. When HAProxy
// is not running it only writes the files, for HAProxy to load when it starts.
// Removing a server blocks until it drained (at most the drain timeout).
// Safe to call repeatedly and from several goroutines (calls are serialized).
func (s *Syncer) Sync(ctx context.Context, cfg *config.Config) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	res, err := s.resolve(cfg)
	if err != nil {
		return err
	}
	dir := res.render.Dir
	out, err := s.r.Render(cfg, res.render)
	if err != nil {
		return err
	}
	check := func() error {
		if s.opts.HAProxyBin != "-" && s.opts.HAProxyBin != "" {
			return s.r.Check(ctx, s.opts.HAProxyBin, cfg, res.render)
		}
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("haproxy dir: %w", err)
	}

	rt, err := s.opts.dial(ctx, res.render.Socket)
	if err != nil {
		if err := check(); err != nil {
			return err
		}
		if werr := writeFiles(dir, out.Files()); werr != nil {
			return werr
		}
		s.log.Warn().Err(err).Str(fieldDir, dir).Msg("HAProxy is not reachable; wrote its files for the next start")
		s.watchReachable(ctx, res.render.Socket)
		return nil
	}
	live, err := readLive(rt)
	if err != nil {
		return err
	}
	onDisk, err := os.ReadFile(filepath.Join(dir, ConfigFile))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("read %s: %w", ConfigFile, err)
	}
	live.Structure = StructureOf(onDisk)
	plan := Diff(out.State, live)
	// "haproxy -c" costs a process start (~1 s on a busy box), too slow for
	// membership changes (Kubernetes scale-ups). A runtime-only plan means
	// the structure hash is the one of the file HAProxy runs, so the new
	// file differs from a checked one only in server lines: check only
	// what a reload would load for the first time.
	if plan.Reload {
		if err := check(); err != nil {
			return err
		}
	}

	// The files first: a reload, ours or anyone's, must find every server.
	if err := writeFiles(dir, out.Files()); err != nil {
		return err
	}
	if plan.Empty() {
		return nil
	}
	if !plan.Reload {
		failed := s.apply(ctx, rt, plan.Runtime, res.drain)
		if len(failed) == 0 {
			return nil
		}
		plan.Reload = true
		plan.Reasons = failed
	}
	return s.reload(ctx, rt, res.render.PIDFile, plan.Reasons)
}

// apply runs runtime commands; it returns one reload reason per command
// that could not be applied over the socket. Removals drain in parallel.
func (s *Syncer) apply(ctx context.Context, rt RuntimeClient, cmds []Cmd, drain time.Duration) []string {
	var (
		mu      sync.Mutex
		reasons []string
		wg      sync.WaitGroup
	)
	failed := func(c Cmd, err error) {
		mu.Lock()
		defer mu.Unlock()
		reasons = append(reasons, fmt.Sprintf("Runtime change %q failed: %v.", c.String(), err))
	}
	for _, c := range cmds {
		l := s.log.With().Str(fieldBackend, c.Backend).Str(fieldServer, c.Server.Name).Logger()
		switch c.Kind {
		case CmdAdd:
			if err := addServer(rt, c); err != nil {
				failed(c, err)
				continue
			}
			l.Info().Str(fieldCmd, c.String()).Msg("added server")
		case CmdSetAddr:
			if err := rt.SetServerAddr(c.Backend, c.Server.Name, c.Server.Host, c.Server.Port); err != nil {
				failed(c, err)
				continue
			}
			l.Info().Str(fieldCmd, c.String()).Msg("moved server")
		case CmdEnable:
			if err := rt.EnableServer(c.Backend, c.Server.Name); err != nil {
				failed(c, err)
				continue
			}
			l.Info().Msg("enabled server found in maintenance")
		case CmdDrain:
			if _, err := rt.ExecuteRaw(c.String()); err != nil {
				failed(c, err)
				continue
			}
			l.Info().Str(fieldCmd, c.String()).Msg("server drain state set")
		case CmdRemove:
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := s.remove(ctx, rt, c, drain, &l); err != nil {
					// A server left in maint takes no traffic; the next sync retries.
					l.Warn().Err(err).Msg("server not deleted")
				}
			}()
		}
	}
	wg.Wait()
	return reasons
}

// addServer adds a server; runtime-added servers start in maint with checks
// off, so it enables both.
func addServer(rt RuntimeClient, c Cmd) error {
	if err := rt.AddServer(c.Backend, c.Server.Name, c.Server.Addr()+" "+c.Params); err != nil {
		return fmt.Errorf("add server: %w", err)
	}
	if err := rt.EnableServerHealth(c.Backend, c.Server.Name); err != nil {
		return fmt.Errorf("enable health: %w", err)
	}
	if err := rt.EnableServer(c.Backend, c.Server.Name); err != nil {
		return fmt.Errorf("enable server: %w", err)
	}
	if c.Server.Drain {
		if _, err := rt.ExecuteRaw("set server " + c.Backend + "/" + c.Server.Name + " state drain"); err != nil {
			return fmt.Errorf("drain server: %w", err)
		}
	}
	return nil
}

// remove puts a server in maint (no new requests, use-server skips it), waits
// until its sessions end or the drain timeout passes, then deletes it.
func (s *Syncer) remove(ctx context.Context, rt RuntimeClient, c Cmd, drain time.Duration, l *zerolog.Logger) error {
	if !c.Server.Maint {
		if err := rt.DisableServer(c.Backend, c.Server.Name); err != nil {
			return fmt.Errorf("disable server: %w", err)
		}
	}
	start := time.Now()
	deadline := start.Add(drain)
	for {
		cur, err := serverSessions(rt, c.Backend, c.Server.Name)
		if err != nil {
			return err
		}
		if cur == 0 {
			break
		}
		if time.Now().After(deadline) {
			l.Warn().Int("sessions", cur).Dur("drain_timeout", drain).Msg("drain timed out; closing the server's sessions")
			if _, err := rt.ExecuteRaw("shutdown sessions server " + c.Backend + "/" + c.Server.Name); err != nil {
				return fmt.Errorf("shutdown sessions: %w", err)
			}
			break
		}
		if err := sleep(ctx, s.opts.PollInterval); err != nil {
			return err
		}
	}
	// "del server" refuses while the server keeps idle keep-alive connections,
	// and 2.6 has no command to close them; changing the address does (the
	// server is in maint and about to go, so the address no longer matters).
	parkPort := 1
	if c.Server.Port == 1 {
		parkPort = 2
	}
	if err := rt.SetServerAddr(c.Backend, c.Server.Name, "127.0.0.1", parkPort); err != nil {
		l.Debug().Err(err).Msg("could not park the address before deletion")
	}
	var err error
	for range 20 {
		if err = rt.DeleteServer(c.Backend, c.Server.Name); err == nil {
			l.Info().Dur("drained", time.Since(start)).Msg("deleted server")
			return nil
		}
		if serr := sleep(ctx, s.opts.PollInterval); serr != nil {
			return serr
		}
	}
	return fmt.Errorf("del server: %w", err)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("haproxy sync: %w", ctx.Err())
	case <-t.C:
		return nil
	}
}

// reload signals the master (SIGUSR2) and waits until a new worker answers
// on the socket, so the next sync plans against it.
func (s *Syncer) reload(ctx context.Context, rt RuntimeClient, pidFile string, reasons []string) error {
	for _, r := range reasons {
		s.log.Info().Str(fieldReason, r).Msg("reloading HAProxy")
	}
	master, err := proxyconf.ReadPID(pidFile, "haproxy")
	if err != nil {
		return fmt.Errorf("reload (%s): %w", strings.Join(reasons, " "), err)
	}
	before, _ := WorkerPID(rt)
	if err := syscall.Kill(master, syscall.SIGUSR2); err != nil {
		return fmt.Errorf("reload: signal master %d: %w", master, err)
	}
	deadline := time.Now().Add(s.opts.ReloadTimeout)
	for time.Now().Before(deadline) {
		if pid, err := WorkerPID(rt); err == nil && pid != before {
			s.log.Info().Int(fieldPID, pid).Msg("HAProxy reloaded")
			return nil
		}
		if err := sleep(ctx, s.opts.PollInterval); err != nil {
			return err
		}
	}
	return fmt.Errorf("reload: no new worker within %s (check HAProxy's log)", s.opts.ReloadTimeout)
}

// WorkerPID returns the Pid from "show info" (the worker serving the socket).
func WorkerPID(rt RuntimeClient) (int, error) {
	out, err := rt.ExecuteRaw("show info")
	if err != nil {
		return 0, fmt.Errorf("show info: %w", err)
	}
	for _, o := range out {
		for line := range strings.Lines(o) {
			if v, ok := strings.CutPrefix(line, "Pid: "); ok {
				return strconv.Atoi(strings.TrimSpace(v))
			}
		}
	}
	return 0, fmt.Errorf("show info: no Pid line")
}

// readLive reads every backend and its servers from the runtime API.
func readLive(rt RuntimeClient) (State, error) {
	st := State{Backends: map[string][]Server{}}
	out, err := rt.ExecuteRaw("show backend")
	if err != nil {
		return st, fmt.Errorf("show backend: %w", err)
	}
	for _, o := range out {
		for line := range strings.Lines(o) {
			name := strings.TrimSpace(line)
			// Internal proxies (<HTTPCLIENT>, ...) are HAProxy's; the route
			// hop and the SPOE agent's and relay backends are covered by the structure hash.
			if name == "" || name[0] == '#' || name[0] == '<' || name == RouteProxy || name == RoutePDProxy || name == SPOEProxy || name == SPOERelayProxy {
				continue
			}
			st.Backends[name] = nil
		}
	}
	out, err = rt.ExecuteRaw("show servers state")
	if err != nil {
		return st, fmt.Errorf("show servers state: %w", err)
	}
	for _, o := range out {
		srvs, err := parseServersState(o)
		if err != nil {
			return st, err
		}
		for b, list := range srvs {
			if _, ok := st.Backends[b]; ok {
				st.Backends[b] = list
			}
		}
	}
	return st, nil
}

// parseServersState reads "show servers state" (format 1): be_id be_name
// srv_id srv_name srv_addr srv_op_state srv_admin_state ... srv_port (field 18).
func parseServersState(out string) (map[string][]Server, error) {
	res := map[string][]Server{}
	sc := bufio.NewScanner(strings.NewReader(out))
	firstLine := true
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if firstLine {
			firstLine = false
			if line != "1" {
				return nil, fmt.Errorf("show servers state: unsupported format %q", line)
			}
			continue
		}
		if line == "" || line[0] == '#' {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 19 {
			return nil, fmt.Errorf("show servers state: short line %q", line)
		}
		admin, _ := strconv.Atoi(f[6])
		port, _ := strconv.Atoi(f[18])
		res[f[1]] = append(res[f[1]], Server{
			Name: f[3], Host: f[4], Port: port,
			// srv_admin (2.6): FMAINT 0x01, IMAINT 0x02, CMAINT 0x04 and
			// RMAINT 0x20 are maintenance; FDRAIN 0x08 and IDRAIN 0x10 drain.
			Maint: admin&0x27 != 0,
			Drain: admin&0x18 != 0,
		})
	}
	return res, nil
}

// serverSessions returns current plus queued sessions of one server from "show stat".
func serverSessions(rt RuntimeClient, backend, server string) (int, error) {
	out, err := rt.ExecuteRaw("show stat")
	if err != nil {
		return 0, fmt.Errorf("show stat: %w", err)
	}
	for _, o := range out {
		var cols map[string]int
		for line := range strings.Lines(o) {
			line = strings.TrimRight(line, "\n")
			if h, ok := strings.CutPrefix(line, "# "); ok {
				cols = map[string]int{}
				for i, c := range strings.Split(h, ",") {
					cols[c] = i
				}
				continue
			}
			f := strings.Split(line, ",")
			if cols == nil || len(f) < len(cols) || f[0] != backend || f[1] != server {
				continue
			}
			scur, _ := strconv.Atoi(f[cols["scur"]])
			qcur, _ := strconv.Atoi(f[cols["qcur"]])
			return scur + qcur, nil
		}
	}
	return 0, fmt.Errorf("show stat: no row for %s/%s", backend, server)
}

// writeFiles replaces each file atomically (proxyconf.WriteFiles), the
// config last (Rendered.Files orders them).
func writeFiles(dir string, files []File) error { return proxyconf.WriteFiles(dir, files) }

// WriteFileAtomic writes data to path through a temp file and a rename, so a
// reading HAProxy never sees half a file (proxyconf.WriteFileAtomic).
func WriteFileAtomic(path string, data []byte) error { return proxyconf.WriteFileAtomic(path, data) }
