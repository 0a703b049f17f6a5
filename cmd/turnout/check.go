package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/cli"
	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/health"
)

// errCheckFailed is check's final error when something was found: each
// problem has been logged already, with its own fields.
var errCheckFailed = errors.New("problems found (see above)")

// runCheck implements `turnout check --config FILE`: everything a reload
// would refuse, and what would break the proxies, before the reload. The
// config's problems all at once (with the policy factories and the served
// model names of answering replicas), every static endpoint's /v1/models,
// and the rendered proxy configs checked by haproxy -c / nginx -t in a
// scratch directory. Exit 0 when all is well, 1 on any problem.
func runCheck(args []string, stdin io.Reader, log *zerolog.Logger) error {
	fs := cli.NewFlags("check")
	cfgPath := fs.String("config", "", "config `FILE` to check (default: the embedded default config)")
	proxies := fs.String("proxy", "auto", "which rendered proxy configs to check: auto (each whose binary is installed), haproxy, nginx, both or none")
	requireEP := fs.Bool("require-endpoints", false, "an endpoint that does not answer GET /v1/models is a problem (default: a warning)")
	timeout := fs.Duration("timeout", health.ServedModelsTimeout, "how long one endpoint may take to answer /v1/models")
	ngx := addNginxFlags(fs, "")
	if err := cli.ParseFlags(fs, checkCmd, args); err != nil {
		return err
	}
	switch {
	case fs.NArg() == 1 && fs.Arg(0) == stdinConfig && *cfgPath == "":
		*cfgPath = stdinConfig
	case fs.NArg() > 0:
		return fmt.Errorf("check: unexpected arguments %q (see turnout check --help)", fs.Args())
	}
	var want []string
	switch *proxies {
	case "auto", "both":
		want = []string{"haproxy", "nginx"}
	case "haproxy", "nginx":
		want = []string{*proxies}
	case "none":
	default:
		return fmt.Errorf("check: --proxy %q must be auto, haproxy, nginx, both or none", *proxies)
	}
	ctx := context.Background()

	// 1. The config: every problem at once, as serve would report them.
	checks := []func(*config.Config) error{checkPolicies, func(c *config.Config) error { return health.VerifyServedModels(ctx, c, nil) }}
	// Read without writing: a feedback token file that does not exist yet
	// is left for serve or render to create.
	var (
		raw       []byte
		file, dir = *cfgPath, filepath.Dir(*cfgPath)
		err       error
	)
	switch *cfgPath {
	case "":
		raw, file, dir = config.DefaultConfigYAML, "(embedded default)", ""
	case stdinConfig:
		if raw, file, err = checkInput(stdin); err != nil {
			return err
		}
		dir = "."
	default:
		if raw, err = os.ReadFile(*cfgPath); err != nil {
			return fmt.Errorf("read config: %w", err)
		}
	}
	var cfg *config.Config
	if dir == "" {
		cfg, err = config.ParseConfig(raw, checks...)
	} else {
		cfg, err = config.ReadConfig(raw, file, dir, checks...)
	}
	if err != nil {
		return err // every problem, reported by cli.ReportError
	}
	cli.LogWarnings(log, file, cfg, nginxModeWarnings(cfg)...)
	log.Info().Str("check", "config").Str("file", file).Int("deployments", len(cfg.Deployments)).Msg("config ok")

	// 2. Every static endpoint's served models.
	problems := checkEndpoints(ctx, cfg, *timeout, *requireEP, log)

	// 3. The rendered proxies, checked by their own binaries.
	problems += checkProxies(ctx, want, *proxies == "auto", cfg, ngx, log)
	if problems > 0 {
		return fmt.Errorf("%d %s: %w", problems, pluralWord(problems, "problem"), errCheckFailed)
	}
	log.Info().Msg("check passed: safe to reload")
	return nil
}

func pluralWord(n int, w string) string {
	if n == 1 {
		return w
	}
	return w + "s"
}
