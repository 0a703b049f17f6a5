package main

import (
	"context"
	"os/exec"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/haproxy"
	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/nginx"
)

// checkProxies checks the rendered config of each proxy in want with the
// proxy's own binary (turnout check's step 3); a proxy that is not
// installed is skipped, with a warning unless auto. It returns the
// problems found.
func checkProxies(ctx context.Context, want []string, auto bool, cfg *config.Config, ngx *nginxFlags, log *zerolog.Logger) (problems int) {
	for _, proxy := range want {
		bin, lerr := exec.LookPath(proxy)
		if lerr != nil {
			ev := log.Info()
			if !auto {
				ev = log.Warn()
			}
			ev.Str("check", proxy).Msg(proxy + " is not installed: its rendered config was not checked")
			continue
		}
		if err := checkProxy(ctx, proxy, bin, cfg, ngx); err != nil {
			problems++
			log.Error().Str("check", proxy).Err(err).Msg("rendered " + proxy + " config refused")
			continue
		}
		log.Info().Str("check", proxy).Str("binary", bin).Msg("rendered " + proxy + " config ok (" + proxyCheckCmd(proxy) + ")")
	}
	return problems
}

// checkProxy renders cfg for proxy into a scratch directory and runs the
// proxy's own check on it.
func checkProxy(ctx context.Context, proxy, bin string, cfg *config.Config, ngx *nginxFlags) error {
	if proxy == "haproxy" {
		r, err := haproxy.NewRenderer(nil)
		if err != nil {
			return err
		}
		return r.Check(ctx, bin, cfg, haproxy.RenderOptions{})
	}
	r, err := nginx.NewRenderer(nil)
	if err != nil {
		return err
	}
	o, err := ngx.options("")
	if err != nil {
		return err
	}
	return r.Check(ctx, bin, cfg, o)
}

func proxyCheckCmd(proxy string) string {
	if proxy == "haproxy" {
		return "haproxy -c"
	}
	return "nginx -t"
}
