package main

import (
	"cmp"
	"flag"
	"fmt"
	"path/filepath"

	"github.com/turnout/turnout/internal/config"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/nginx"
)

// nginxFlags are the nginx options shared by serve (sync) and render.
type nginxFlags struct {
	dir, pidfile, module, user *string
	headersMore                *string
}

// addNginxFlags registers the flags; --nginx-dir only when dirUsage is set
// (render takes --out instead).
func addNginxFlags(fs *flag.FlagSet, dirUsage string) *nginxFlags {
	f := &nginxFlags{
		dir:     new(string),
		pidfile: fs.String("nginx-pidfile", "", "nginx master pidfile `PATH`, for reloads (default DIR/nginx.pid)"),
		module:  fs.String("nginx-js-module", "", "njs module for load_module (default "+nginx.DefaultModulePath+"; - = built in)"),
		user:    fs.String("nginx-user", "", "user directive for nginx workers (default: nginx's own)"),
		headersMore: fs.String("nginx-headers-more", "", "headers-more module for load_module, to strip every client X-Turnout-*/X-Original-* header (default "+
			nginx.DefaultHeadersMorePath+"; - = built in; "+nginx.HeadersMoreOff+" = clear only turnout's own header names)"),
	}
	if dirUsage != "" {
		f.dir = fs.String("nginx-dir", "", dirUsage)
	}
	return f
}

func (f *nginxFlags) options(dir string) (nginx.RenderOptions, error) {
	o := nginx.RenderOptions{PIDFile: *f.pidfile, ModulePath: *f.module, User: *f.user, HeadersMore: *f.headersMore}
	if dir != "" {
		abs, err := filepath.Abs(dir)
		if err != nil {
			return o, fmt.Errorf("nginx dir: %w", err)
		}
		o.Dir = abs
	}
	if o.PIDFile != "" {
		abs, err := filepath.Abs(o.PIDFile)
		if err != nil {
			return o, fmt.Errorf("nginx pidfile: %w", err)
		}
		o.PIDFile = abs
	}
	return o, nil
}

// syncOptions returns the nginx render options when --nginx-dir enables
// nginx sync, else nil.
func (f *nginxFlags) syncOptions() (*nginx.RenderOptions, error) {
	if *f.dir == "" {
		return nil, nil
	}
	o, err := f.options(*f.dir)
	if err != nil {
		return nil, err
	}
	return &o, nil
}

// renderNginx implements `turnout render nginx --config FILE --out DIR`.
func renderNginx(cfg *config.Config, out, prefix string, check bool, f *nginxFlags, log *zerolog.Logger) error {
	out = cmp.Or(out, cfg.Nginx.Dir)
	dir, err := renderDir("nginx", out)
	if err != nil {
		return err
	}
	// Paths inside the files: under prefix when set (used from there), else out.
	o, err := f.options(cmp.Or(prefix, out))
	if err != nil {
		return err
	}
	if _, err := writeRendered[nginx.RenderOptions, *nginx.Rendered]("nginx", dir, nginx.NewRenderer, cfg, o, check,
		nginx.CheckFiles, nginx.WriteFiles); err != nil {
		return err
	}
	log.Info().Str("dir", dir).Str("path_prefix", o.Dir).Msg("rendered nginx config; start it with: nginx -p " + o.Dir + " -c " + filepath.Join(o.Dir, nginx.ConfigFile))
	return nil
}
