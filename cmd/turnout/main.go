// Command turnout is the route-decision service for LLM replicas behind
// HAProxy or nginx. Subcommands: serve, render, version. The mock replica
// and the benchmarks are another binary, cmd/turnout-lab.
package main

import (
	"fmt"
	"io"
	"os"

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
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	out := cli.NewOutput(stdout, stderr)
	log := out.Log
	var err error
	switch args[0] {
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	case "version", "--version":
		if cli.WantsHelp(args[1:]) {
			fmt.Fprint(stdout, versionCmd.Help(cli.NewFlags("version")))
			return 0
		}
		if len(args) > 1 {
			fmt.Fprintf(stderr, "turnout version: unexpected arguments %q (see turnout version --help)\n", args[1:])
			return 2
		}
		fmt.Fprintf(stdout, "turnout %s\n", version)
		return 0
	case "serve":
		err = runServe(args[1:], log)
	case "render":
		err = runRender(args[1:], log)
	case "check":
		err = runCheck(args[1:], os.Stdin, log)
	case "mock", "bench":
		fmt.Fprintf(stderr, "turnout: %s is a command of turnout-lab (cmd/turnout-lab, bin/turnout-lab after make build): turnout-lab %s --help\n", args[0], args[0])
		return 2
	default:
		fmt.Fprintf(stderr, "%s\n\n%s", cli.UnknownCommand("turnout", args[0], commands), usage)
		return 2
	}
	return out.Exit("turnout "+args[0], err)
}
