// Command turnout is the route-decision service for LLM replicas behind
// HAProxy or nginx. Subcommands: serve, render, version. The mock replica
// and the benchmarks are another binary, cmd/turnout-lab.
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/cli"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

const usage = `turnout: route decisions for LLM replicas behind HAProxy or nginx

Usage:
  turnout serve  [--config FILE] [--log-level LEVEL] [--haproxy-socket PATH ...]
  turnout render haproxy|nginx [--config FILE] --out DIR
  turnout check  [--config FILE]   (before a reload: config, endpoints, proxy configs)
  turnout version

Without --config, turnout uses an embedded default (four loopback replicas
on 127.0.0.1:8001-8004, listening on 127.0.0.1:9090).
Run "turnout <command> --help" for a command's flags. The mock replica and
the benchmarks are in turnout-lab (turnout-lab --help).

Example:
  turnout render haproxy --config turnout.yaml --out /etc/haproxy/turnout &&
  turnout serve --config turnout.yaml --haproxy-dir /etc/haproxy/turnout
`

// commands are the subcommands, for "did you mean" after a misspelt one.
var commands = []string{"serve", "render", "check", "version", "help"}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "version", "--version":
			return runVersion(args[1:], stdout, stderr)
		case "mock", "bench":
			fmt.Fprintf(stderr, "turnout: %s is a command of turnout-lab (cmd/turnout-lab, bin/turnout-lab after make build): turnout-lab %s --help\n", args[0], args[0])
			return 2
		}
	}
	return cli.Main("turnout", usage, commands,
		map[string]func([]string, *zerolog.Logger) error{"serve": runServe, "render": runRender,
			"check": func(args []string, log *zerolog.Logger) error { return runCheck(args, os.Stdin, log) }}, args, stdout, stderr)
}

// runVersion prints the version (exit 0), or refuses arguments (exit 2).
func runVersion(args []string, stdout, stderr io.Writer) int {
	if cli.WantsHelp(args) {
		fmt.Fprint(stdout, versionCmd.Help(cli.NewFlags("version")))
		return 0
	}
	if len(args) > 0 {
		fmt.Fprintf(stderr, "turnout version: unexpected arguments %q (see turnout version --help)\n", args)
		return 2
	}
	fmt.Fprintf(stdout, "turnout %s\n", version)
	return 0
}
