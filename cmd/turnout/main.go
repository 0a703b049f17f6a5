// Command turnout is the route-decision service for LLM replicas behind
// HAProxy or nginx. Subcommands: serve, render, mock, bench, version.
package main

import (
	"errors"
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

Example:
  turnout render haproxy --config turnout.yaml --out /etc/haproxy/turnout &&
  turnout serve --config turnout.yaml --haproxy-dir /etc/haproxy/turnout
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	human := humanOutput(stderr, os.Getenv("TURNOUT_LOG_FORMAT"))
	log := newLogger(stderr, os.Getenv("TURNOUT_LOG_LEVEL"), human)
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
		var h *helpShown
		if errors.As(err, &h) {
			fmt.Fprint(stdout, h.text)
			return 0
		}
		reportError(stderr, log, human, "turnout "+args[0], err)
		return 1
	}
	return 0
}

// newLogger builds the one root logger; packages get it through struct fields.
// human: zerolog's console format (a person at a terminal), else JSON lines.
func newLogger(w io.Writer, level string, human bool) *zerolog.Logger {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil || level == "" {
		lvl = zerolog.InfoLevel
	}
	if human {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: "15:04:05.000", NoColor: true}
	}
	l := zerolog.New(w).Level(lvl).With().Timestamp().Logger()
	zerolog.TimeFieldFormat = time.RFC3339Nano
	return &l
}
