// Command turnout-lab is turnout's lab: the mock vLLM replica the demo, the
// e2e tests and the benchmarks run in place of GPUs, and the benchmark
// harness. It is a binary of its own so that the serving binary, turnout,
// links neither (cmd/turnout/deps_test.go). Subcommands: mock, bench, hog.
package main

import (
	"io"
	"os"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/cli"
)

const usage = `turnout-lab: the mock replica and the benchmarks of turnout

Usage:
  turnout-lab mock   --listen ADDR --name NAME [...]   (OpenAI-compatible mock replica)
  turnout-lab bench  replay|azure|cost|trivial|policies [...]
  turnout-lab hog    [--cpus N] [--for DURATION]     (burn CPU: the busy machine for make test-hog)

Run "turnout-lab <command> --help" for a command's flags.

Example:
  turnout-lab mock --listen 127.0.0.1:8001 --name llama-0 --time-scale 0.05
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	return cli.Main("turnout-lab", usage, []string{"mock", "bench", "hog", "help"},
		map[string]func([]string, *zerolog.Logger) error{"mock": runMock, "bench": runBench, "hog": runHog}, args, stdout, stderr)
}
