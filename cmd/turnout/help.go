package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// helpShown carries a command's help text up to run(), which prints it on
// stdout and exits 0: "--help" is a request, not an error.
type helpShown struct{ text string }

func (h *helpShown) Error() string { return "help requested" }

// command describes one (sub)command for its --help: a synopsis line, what it
// does, and one example.
type command struct {
	synopsis, about, example string
}

// newFlags returns a FlagSet whose own messages are silenced: parseFlags
// prints help and usage errors itself, once, on the right stream.
func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// parseFlags parses args; -h/--help returns *helpShown with the full help, a
// bad flag an error that names it and points at --help.
func parseFlags(fs *flag.FlagSet, c command, args []string) error {
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		return &helpShown{text: c.help(fs)}
	}
	if err != nil {
		return fmt.Errorf("%s: %w (see turnout %s --help)", fs.Name(), err, fs.Name())
	}
	return nil
}

// help renders the synopsis, description, example and flag defaults.
func (c command) help(fs *flag.FlagSet) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Usage: %s\n\n%s\n\nExample:\n  %s\n", c.synopsis, strings.TrimSpace(c.about), c.example)
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n > 0 {
		b.WriteString("\nFlags:\n")
		fs.SetOutput(&b)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	return b.String()
}

// The commands' help texts (one example each; TestHelp checks them).
var (
	serveCmd = command{
		synopsis: "turnout serve [--config FILE] [--listen ADDR] [--haproxy-dir DIR | --nginx-dir DIR] [flags]",
		about: `Serves route decisions (POST /internal/route), /healthz, /readyz, /metrics and
completion feedback. Reloads the config on SIGHUP and when the file changes.
With --haproxy-dir or --nginx-dir it also keeps the rendered proxy's pools in
sync. Without --config it uses the embedded default (four loopback replicas on
127.0.0.1:8001-8004, listening on 127.0.0.1:9090).`,
		example: "turnout serve --config /etc/turnout/turnout.yaml --haproxy-dir /etc/haproxy/turnout",
	}
	renderCmd = command{
		synopsis: "turnout render haproxy|nginx [--config FILE] --out DIR [flags]",
		about: `Writes the proxy configuration and glue for a turnout config.
Targets: haproxy (haproxy.cfg + SPOE file, or Lua), nginx (nginx.conf + njs).
Run "turnout render haproxy --help" or "turnout render nginx --help" for a target's flags.`,
		example: "turnout render haproxy --config turnout.yaml --out /etc/haproxy/turnout",
	}
	renderHAProxyCmd = command{
		synopsis: "turnout render haproxy [--config FILE] --out DIR [--socket PATH] [--check=false]",
		about: `Writes haproxy.cfg, turnout-spoe.conf, turnout.lua (and models.map) into DIR;
files refer to each other by DIR's absolute path. Start HAProxy with:
haproxy -f DIR/haproxy.cfg (turnout serve --haproxy-dir DIR serves its SPOE agent)`,
		example: "turnout render haproxy --config turnout.yaml --out /etc/haproxy/turnout",
	}
	renderNginxCmd = command{
		synopsis: "turnout render nginx [--config FILE] --out DIR [--nginx-user USER] [--check=false]",
		about: `Writes nginx.conf and the njs module into DIR. Start nginx with:
nginx -p DIR -c DIR/nginx.conf`,
		example: "turnout render nginx --config turnout.yaml --out /etc/nginx/turnout --nginx-user www-data",
	}
	mockCmd = command{
		synopsis: "turnout mock [--listen ADDR] [--name NAME] [--model NAMES] [flags]",
		about: `Runs one OpenAI-compatible mock vLLM replica (chat, completions, SSE, /health,
/metrics with vLLM's prefix-cache counters, /tokenize, optional KV-cache events)
for demos and tests.`,
		example: "turnout mock --listen 127.0.0.1:8001 --name llama-0 --model meta-llama/Llama-3.1-8B-Instruct,llama --time-scale 0.05",
	}
	benchReplayCmd = command{
		synopsis: "turnout bench replay|azure --trace FILE [--mode sim|e2e] [--policies SPECS] [flags]",
		about:    `Replays a request trace against every policy and reports prefix-cache hit ratios, load balance and latency (BENCHMARKS.md).`,
		example:  "turnout bench replay --trace synthetic --limit 200",
	}
	benchCostCmd = command{
		synopsis: "turnout bench cost [--duration D] [--rounds N] [flags]",
		about:    `Measures what a decision costs: /internal/route against a trivial handler, HAProxy and nginx alone against with turnout.`,
		example:  "turnout bench cost --duration 2s --rounds 3 --nginx ''",
	}
	benchTrivialCmd = command{
		synopsis: "turnout bench trivial [--listen ADDR]",
		about:    `Serves the trivial fasthttp handler that bench cost compares /internal/route with.`,
		example:  "turnout bench trivial --listen 127.0.0.1:9099",
	}
)

// wantsHelp reports whether args ask for help before any target is named.
func wantsHelp(args []string) bool {
	for _, a := range args {
		switch a {
		case "-h", "-help", "--help", "help":
			return true
		}
	}
	return false
}
