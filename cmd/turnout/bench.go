package main

import (
	"fmt"

	"github.com/rs/zerolog"
)

// runBench dispatches the benchmark subcommands.
func runBench(args []string, log *zerolog.Logger) error {
	_ = log
	return fmt.Errorf("bench: no subcommand %v is available in this build", args)
}
