package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/turnout/turnout/internal/cli"
	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/internal/proxyconf"
	"github.com/turnout/turnout/internal/suggest"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/haproxy"
	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/policy"
)

// runRender implements `turnout render haproxy|nginx --config FILE --out DIR`.
// Each target has its own flags (and help): --socket is HAProxy's, the
// --nginx-* flags nginx's.
func runRender(args []string, log *zerolog.Logger) error {
	if len(args) == 0 || args[0] == "" || args[0][0] == '-' || args[0] == "help" {
		if cli.WantsHelp(args) {
			return &cli.HelpShown{Text: renderCmd.Help(cli.NewFlags("render"))}
		}
		return errors.New("render: name a target: turnout render haproxy|nginx [--config FILE] --out DIR (see turnout render --help)")
	}
	target := args[0]
	fs := cli.NewFlags("render " + target)
	cfgPath := fs.String("config", "", "config `FILE` (default: embedded default config)")
	prefix := fs.String("path-prefix", "", "absolute `DIR` the files will be used from, written into them instead of --out's (a render in a container to --out /out for the host's /etc/haproxy/turnout)")
	var (
		cmd    cli.Command
		socket *string
		ngx    *nginxFlags
		check  *bool
	)
	switch target {
	case "haproxy":
		cmd = renderHAProxyCmd
		fs.String("out", "", "output `DIR` (default: the config's haproxy.dir); files refer to each other by this absolute path")
		socket = fs.String("socket", "", "admin stats socket `PATH` (default: haproxy.stats_socket, else OUT/admin.sock)")
		check = fs.Bool("check", true, "check the TLS files and run haproxy -c on the result (when haproxy is installed)")
	case "nginx":
		cmd = renderNginxCmd
		fs.String("out", "", "output `DIR` (default: the config's nginx.dir)")
		ngx = addNginxFlags(fs, "")
		check = fs.Bool("check", true, "check the TLS files and run nginx -t on the result (when nginx is installed)")
	default:
		hint := ""
		if best := suggest.Nearest(target, []string{"haproxy", "nginx"}); best != "" {
			hint = fmt.Sprintf("; did you mean %q?", best)
		}
		return fmt.Errorf("render: unknown target %q%s (supported: haproxy, nginx)", target, hint)
	}
	if err := cli.ParseFlags(fs, cmd, args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("render %s: unexpected arguments %q", target, fs.Args())
	}
	out := fs.Lookup("out").Value.String()
	var (
		cfg *config.Config
		err error
	)
	// Policy names and params too, so nothing wrong reaches a proxy config.
	if *cfgPath == "" {
		cfg, err = config.ParseConfig(config.DefaultConfigYAML, checkPolicies)
	} else {
		cfg, err = config.LoadConfigFile(*cfgPath, checkPolicies)
	}
	if err != nil {
		return err
	}
	cli.LogWarnings(log, *cfgPath, cfg)
	if *prefix != "" && !filepath.IsAbs(*prefix) {
		return fmt.Errorf("render %s: --path-prefix %q must be an absolute path (the directory the proxy reads the files from)", target, *prefix)
	}
	if target == "haproxy" {
		return renderHAProxy(cfg, out, *prefix, *socket, *check, log)
	}
	return renderNginx(cfg, out, *prefix, *check, ngx, log)
}

// renderHAProxy writes the files into out; inside them every path is under
// prefix when set (the files are used from another path than they are
// written to), else under out.
func renderHAProxy(cfg *config.Config, out, prefix, socket string, check bool, log *zerolog.Logger) error {
	dir, err := renderDir("haproxy", cmp.Or(out, cfg.HAProxy.Dir))
	if err != nil {
		return err
	}
	opts := haproxy.RenderOptions{Dir: dir, Socket: socket}
	if prefix != "" {
		opts.Dir = filepath.Clean(prefix)
	}
	files, err := writeRendered[haproxy.RenderOptions, *haproxy.Rendered]("haproxy", dir, haproxy.NewRenderer, cfg, opts, check,
		haproxy.CheckFiles, proxyconf.WriteFiles)
	if err != nil {
		return err
	}
	log.Info().Str("dir", dir).Str("path_prefix", opts.Dir).Str("structure", files.State.Structure).Msg("rendered HAProxy config")
	warnSPOEFromFlag(cfg, dir, log) // spoewarn.go
	return nil
}

// renderDir is the directory a render writes into, out (--out, else the
// proxy's dir in the config) made absolute.
func renderDir(proxy, out string) (string, error) {
	if out == "" {
		return "", fmt.Errorf("render %s: --out DIR is required (or set %s.dir)", proxy, proxy)
	}
	dir, err := filepath.Abs(out)
	if err != nil {
		return "", fmt.Errorf("render %s: %w", proxy, err)
	}
	return dir, nil
}

// renderer is what writeRendered needs of a proxy's renderer.
type renderer[O any, R interface{ Files() []proxyconf.File }] interface {
	Render(cfg *config.Config, opts O) (R, error)
	Check(ctx context.Context, bin string, cfg *config.Config, opts O) error
}

// writeRendered renders cfg with the proxy's embedded templates, checks
// the render and writes its files into dir with write (nginx's also makes
// the temp directory nginx needs). checkFiles checks the files the config
// names (TLS certificates); the proxy's own check runs when its binary is
// on PATH. Neither runs with --check=false: the files may live on another
// host (a container render).
func writeRendered[O any, R interface{ Files() []proxyconf.File }, P renderer[O, R]](proxy, dir string, newRenderer func(fs.FS) (P, error),
	cfg *config.Config, opts O, check bool, checkFiles func(*config.Config) error, write func(string, []proxyconf.File) error) (R, error) {
	var none R
	r, err := newRenderer(nil)
	if err != nil {
		return none, err
	}
	files, err := r.Render(cfg, opts)
	if err != nil {
		return none, err
	}
	if check {
		if err := checkFiles(cfg); err != nil {
			return none, err
		}
		if bin, err := exec.LookPath(proxy); err == nil {
			if err := r.Check(context.Background(), bin, cfg, opts); err != nil {
				return none, err
			}
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return none, fmt.Errorf("render %s: %w", proxy, err)
	}
	return files, write(dir, files.Files())
}

// checkPolicies builds every pool's policy once, so a bad policy name or
// parameter is reported with the config's other problems.
func checkPolicies(cfg *config.Config) error {
	return route.CheckPolicies(cfg, policy.DefaultRegistry())
}
