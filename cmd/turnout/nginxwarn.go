package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/policy"
)

// nginxModeWarnings lists the nginx header-mode combinations docs/nginx.md
// calls broken. Header mode is never a default (nginx.mode defaults to
// body), so a config that has it means nginx; check and serve warn on it.
func nginxModeWarnings(cfg *config.Config) []*config.FieldError {
	var out []*config.FieldError
	warn := func(path, format string, a ...any) {
		out = append(out, &config.FieldError{Path: path, Line: cfg.Line(path), Msg: fmt.Sprintf(format, a...)})
	}
	// modeField is where a deployment's header mode comes from: nginx.mode
	// when that says header, else the deployment's own nginx_mode.
	modeField := func(i int) string {
		if cfg.Nginx.Mode == config.NginxModeHeader {
			return "nginx.mode"
		}
		return fmt.Sprintf("deployments[%d].nginx_mode", i)
	}
	var header []int
	for i := range cfg.Deployments {
		if cfg.Deployments[i].NginxMode == config.NginxModeHeader {
			header = append(header, i)
		}
	}
	// nginx picks the mode before it reads the body: without a model header
	// a request takes body mode if any deployment has it, else header mode,
	// where turnout cannot tell the deployments apart.
	if n := len(cfg.Deployments); n > 1 && len(header) == n {
		warn(modeField(0), "every deployment uses nginx header mode and there are %d: behind nginx a request without a model header (%s) is refused 400 model_required, and OpenAI clients send the model in the body only; use nginx.mode body (or give one deployment nginx_mode: body)",
			n, strings.Join(cfg.ModelHeaders, ", "))
	}
	for _, i := range header {
		d := &cfg.Deployments[i]
		if d.IsPD() {
			warn(modeField(i), "deployment %s is prefill/decode: nginx header mode cannot run it (turnout needs the whole body for the prefill, njs builds the decode body); the nginx render refuses it: use nginx_mode: body", d.Name)
		}
		var prompt []string
		if policy.ReadsPrompt(&d.Policy) {
			prompt = append(prompt, d.Policy.Name)
		}
		for j := range d.Pools {
			if p := d.Pools[j].Policy; p != nil && policy.ReadsPrompt(p) && !slices.Contains(prompt, p.Name) {
				prompt = append(prompt, p.Name)
			}
		}
		if len(prompt) > 0 {
			warn(modeField(i), "deployment %s: policy %s reads the prompt, which nginx header mode does not send to turnout (the body is not read for routing): its prefix or KV matching does nothing there; use nginx_mode: body",
				d.Name, strings.Join(prompt, ", "))
		}
	}
	return out
}
