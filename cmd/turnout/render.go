package main

import (
	"context"
	"errors"
	"fmt"
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
	if out == "" {
		out = cfg.HAProxy.Dir
	}
	if out == "" {
		return errors.New("render haproxy: --out DIR is required (or set haproxy.dir)")
	}
	dir, err := filepath.Abs(out)
	if err != nil {
		return fmt.Errorf("render haproxy: %w", err)
	}
	opts := haproxy.RenderOptions{Dir: dir, Socket: socket}
	if prefix != "" {
		opts.Dir = filepath.Clean(prefix)
	}
	r, err := haproxy.NewRenderer(nil)
	if err != nil {
		return err
	}
	files, err := r.Render(cfg, opts)
	if err != nil {
		return err
	}
	err = writeRendered("haproxy", dir, files.Files(), check, func() error { return haproxy.CheckFiles(cfg) },
		func(bin string) error { return r.Check(context.Background(), bin, cfg, opts) }, proxyconf.WriteFiles)
	if err != nil {
		return err
	}
	log.Info().Str("dir", dir).Str("path_prefix", opts.Dir).Str("structure", files.State.Structure).Msg("rendered HAProxy config")
	warnSPOEFromFlag(cfg, dir, log) // spoewarn.go
	return nil
}

// writeRendered checks a proxy's render and writes its files into dir
// with write (nginx's also makes the temp directory nginx needs).
// checkFiles checks the files the config names (TLS certificates);
// checkBin runs the proxy's own check when its binary is on PATH. Neither
// runs with --check=false: the files may live on another host (a container
// render).
func writeRendered(proxy, dir string, files []proxyconf.File, check bool, checkFiles func() error, checkBin func(bin string) error, write func(string, []proxyconf.File) error) error {
	if check {
		if err := checkFiles(); err != nil {
			return err
		}
		if bin, err := exec.LookPath(proxy); err == nil {
			if err := checkBin(bin); err != nil {
				return err
			}
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("render %s: %w", proxy, err)
	}
	return write(dir, files)
}

// checkPolicies builds every pool's policy once, so a bad policy name or
// parameter is reported with the config's other problems.
func checkPolicies(cfg *config.Config) error {
	return route.CheckPolicies(cfg, policy.DefaultRegistry())
}
