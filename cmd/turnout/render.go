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
	cfgPath := fs.String("config", "", "config file (default: embedded default config)")
	var (
		cmd    cli.Command
		socket *string
		ngx    *nginxFlags
		check  *bool
	)
	switch target {
	case "haproxy":
		cmd = renderHAProxyCmd
		fs.String("out", "", "output directory (default: the config's haproxy.dir); files refer to each other by this absolute path")
		socket = fs.String("socket", "", "admin stats socket path (default: haproxy.stats_socket, else OUT/admin.sock)")
		check = fs.Bool("check", true, "run haproxy -c on the result when haproxy is installed")
	case "nginx":
		cmd = renderNginxCmd
		fs.String("out", "", "output directory (default: the config's nginx.dir)")
		ngx = addNginxFlags(fs, "")
		check = fs.Bool("check", true, "run nginx -t on the result when nginx is installed")
	default:
		return fmt.Errorf("render: unknown target %q (supported: haproxy, nginx)", target)
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
	if *cfgPath == "" {
		cfg, err = config.ParseConfig(config.DefaultConfigYAML)
	} else {
		cfg, err = config.LoadConfigFile(*cfgPath)
	}
	if err != nil {
		return err
	}
	// Policy names and params too, so nothing wrong reaches a proxy config.
	if err := route.CheckPolicies(cfg, policy.DefaultRegistry()); err != nil {
		return cli.WithFile(err, *cfgPath)
	}
	cli.LogWarnings(log, *cfgPath, cfg)
	if target == "haproxy" {
		return renderHAProxy(cfg, out, *socket, *check, log)
	}
	return renderNginx(cfg, out, *check, ngx, log)
}

func renderHAProxy(cfg *config.Config, out, socket string, check bool, log *zerolog.Logger) error {
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
	r, err := haproxy.NewRenderer(nil)
	if err != nil {
		return err
	}
	files, err := r.Render(cfg, opts)
	if err != nil {
		return err
	}
	if bin, lerr := exec.LookPath("haproxy"); check && lerr == nil {
		if err := r.Check(context.Background(), bin, cfg, opts); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("render haproxy: %w", err)
	}
	for _, f := range files.Files() {
		if err := haproxy.WriteFileAtomic(filepath.Join(dir, f.Name), f.Data); err != nil {
			return err
		}
	}
	log.Info().Str("dir", dir).Str("structure", files.State.Structure).Msg("rendered HAProxy config")
	warnSPOEFromFlag(cfg, dir, log) // spoewarn.go
	return nil
}
