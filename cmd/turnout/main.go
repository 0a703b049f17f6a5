// Command turnout is the route-decision service for LLM replicas behind
// HAProxy or nginx. Subcommands: serve, render, mock, bench, version.
package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/rs/zerolog"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

const usage = `turnout: route decisions for LLM replicas behind HAProxy or nginx

Usage:
  turnout serve  [--config FILE] [--log-level LEVEL] [--haproxy-socket PATH ...]
  turnout render haproxy|nginx [--config FILE] --out DIR
  turnout mock   --listen ADDR --name NAME [...]   (OpenAI-compatible mock replica)
  turnout bench  replay|... [...]
  turnout version

Without --config, turnout uses an embedded default (four loopback replicas
on 127.0.0.1:8001-8004, listening on 127.0.0.1:9090).
Run "turnout <command> --help" for a command's flags.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	log := newLogger(stderr, os.Getenv("TURNOUT_LOG_LEVEL"))
	var err error
	switch args[0] {
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	case "version", "--version":
		fmt.Fprintf(stdout, "turnout %s\n", version)
		return 0
	case "serve":
		err = runServe(args[1:], log)
	case "render":
		err = runRender(args[1:], log)
	case "mock":
		err = runMock(args[1:], log)
	case "bench":
		err = runBench(args[1:], log)
	default:
		fmt.Fprintf(stderr, "turnout: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	if err != nil {
		log.Error().Err(err).Msg("turnout " + args[0])
		return 1
	}
	return 0
}

// newLogger builds the one root logger; packages get it through struct fields.
func newLogger(w io.Writer, level string) *zerolog.Logger {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil || level == "" {
		lvl = zerolog.InfoLevel
	}
	l := zerolog.New(w).Level(lvl).With().Timestamp().Logger()
	zerolog.TimeFieldFormat = time.RFC3339Nano
	return &l
}
