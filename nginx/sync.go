package nginx

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/turnout/turnout/internal/config"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/proxyconf"
)

// Log field names.
const (
	fieldDir    = "dir"
	fieldPID    = "pid"
	fieldReason = "reason"
)

// SyncOptions configure a Syncer. Empty fields come from the config's nginx
// section at each Sync.
type SyncOptions struct {
	// Render says where the files go (Dir default nginx.dir) and how nginx runs.
	Render RenderOptions
	// NginxBin checks each new config with "nginx -t" before it is written
	// ("" = look up "nginx" in PATH, "-" = do not check).
	NginxBin string
	// ReloadTimeout bounds the wait for the new workers after SIGHUP (default 15s).
	ReloadTimeout time.Duration
	// PollInterval is how often a reload is polled (default 50ms).
	PollInterval time.Duration
}

// Syncer keeps one nginx in line with turnout's config. Replicas coming
// and going need nothing from nginx (plan.go); nginx OSS has no runtime
// API, so any other change is checked, written and loaded with a graceful
// reload (SIGHUP to the master: new workers take new requests, old ones
// finish their streams).
type Syncer struct {
	opts SyncOptions
	log  *zerolog.Logger
	r    *Renderer
	mu   sync.Mutex // one Sync at a time
	// unloaded is the replica change last logged as needing no reload.
	unloaded string
	// run logs when nginx runs after a sync found it not running (reach.go).
	run proxyconf.UpWatch
}

// NewSyncer prepares a Syncer; it does not touch nginx yet.
func NewSyncer(opts SyncOptions, log *zerolog.Logger) (*Syncer, error) {
	r, err := NewRenderer(nil)
	if err != nil {
		return nil, err
	}
	proxyconf.SyncDefaults{Bin: &opts.NginxBin, ReloadTimeout: &opts.ReloadTimeout, PollInterval: &opts.PollInterval}.
		Fill("nginx", 50*time.Millisecond)
	for _, p := range []string{opts.Render.Dir, opts.Render.PIDFile} {
		if p != "" && !filepath.IsAbs(p) {
			return nil, fmt.Errorf("nginx sync: %q must be an absolute path", p)
		}
	}
	return &Syncer{opts: opts, log: proxyconf.Logger(log), r: r}, nil
}

// Sync renders cfg and plans (plan.go) against the files on disk, which
// are what nginx runs: nothing when they are the same; when only replicas
// changed, nothing either, logged (requests go to the address turnout
// answers); otherwise it checks the render with "nginx -t", writes it and
// reloads a running nginx, logging why. When nginx is not running it only
// writes the files, for nginx to load when it starts. It returns once the
// new workers run (or ReloadTimeout). Safe to call repeatedly and from
// several goroutines (calls are serialized).
func (s *Syncer) Sync(ctx context.Context, cfg *config.Config) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	ro := s.opts.Render.withDefaults(cfg)
	if ro.Dir == "" {
		return errors.New("nginx sync: no directory (set --nginx-dir or nginx.dir)")
	}
	out, err := s.r.Render(cfg, ro)
	if err != nil {
		return err
	}
	plan, same, err := planOnDisk(ro.Dir, out)
	if err != nil {
		return err
	}
	if same {
		s.log.Debug().Str(fieldDir, ro.Dir).Msg("nginx config unchanged; no reload")
		return nil
	}
	pid, perr := proxyconf.ReadPID(ro.PIDFile, "nginx")
	if perr == nil && !plan.Reload {
		// The file stays what nginx runs, so the next plan compares with
		// it; the same difference comes back at every sync until the next
		// reload: logged once.
		ev := s.log.Debug()
		if plan.Reason != s.unloaded {
			s.unloaded = plan.Reason
			ev = s.log.Info()
		}
		ev.Int(fieldPID, pid).Str(fieldReason, plan.Reason).
			Msg("replicas changed; nginx not reloaded (it sends requests to the address turnout answers)")
		return nil
	}
	s.unloaded = ""
	if s.opts.NginxBin != "" && s.opts.NginxBin != "-" {
		if err := s.r.Check(ctx, s.opts.NginxBin, cfg, ro); err != nil {
			return err
		}
	}
	if err := WriteFiles(ro.Dir, out.Files()); err != nil {
		return err
	}
	if perr != nil {
		s.log.Warn().Err(perr).Str(fieldDir, ro.Dir).Str(fieldReason, plan.Reason).Msg("nginx is not running; wrote its files for the next start")
		s.watchRunning(ctx, ro.PIDFile)
		return nil
	}
	return s.reload(ctx, pid, plan.Reason)
}

// reload sends SIGHUP to the master and waits until a worker that was not
// there before runs: nginx forks the new workers only after it accepted the
// new config, so a new worker means the reload took.
func (s *Syncer) reload(ctx context.Context, pid int, reason string) error {
	before := children(pid)
	s.log.Info().Int(fieldPID, pid).Str(fieldReason, reason).Msg("reloading nginx")
	if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
		return fmt.Errorf("reload nginx (pid %d): %w", pid, err)
	}
	if before == nil {
		return nil // no /proc: cannot tell when it is done
	}
	t := time.NewTicker(s.opts.PollInterval)
	defer t.Stop()
	deadline := time.After(s.opts.ReloadTimeout)
	for {
		for _, c := range children(pid) {
			if !slices.Contains(before, c) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("reload nginx: %w", ctx.Err())
		case <-deadline:
			return fmt.Errorf("reload nginx (pid %d): no new worker after %v; see its error log", pid, s.opts.ReloadTimeout)
		case <-t.C:
		}
	}
}

// Workers lists the worker pids of the nginx master pid (nil without /proc).
func Workers(master int) []int { return children(master) }

// children lists the pids whose parent is pid, from /proc (empty when /proc is
// not there). nginx's master has no other children than its workers here.
func children(pid int) []int { return proxyconf.Children(pid) }
