package main

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/lab/bench"
)

// errTraceMissing makes a missing trace a clean skip, not a failure.
var errTraceMissing = errors.New("trace missing")

// loadTrace reads a trace file or makes the synthetic one; label names it in
// outputs.
func loadTrace(path string, o bench.TraceOptions) ([]bench.Request, string, error) {
	if path == syntheticTrace {
		n := o.Limit
		if n == 0 {
			n = 400
		}
		return bench.SyntheticTrace(n, 1), syntheticTrace, nil
	}
	reqs, err := bench.LoadTrace(path, o)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "", fmt.Errorf("%s: %w", path, errTraceMissing)
	}
	if err != nil {
		return nil, "", err
	}
	label := strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	label = strings.SplitN(label, "_", 2)[0] // mooncake, azure
	if strings.HasPrefix(filepath.Base(path), "azure_llm_2023_") {
		label = "azure-" + strings.TrimSuffix(strings.TrimPrefix(filepath.Base(path), "azure_llm_2023_"), ".csv")
	}
	return reqs, label, nil
}

// skipMissingTrace reports whether err is a missing trace file, logged as
// a clean skip of the benchmark (what names it, with a leading space).
func skipMissingTrace(err error, path, what string, log *zerolog.Logger) bool {
	if !errors.Is(err, errTraceMissing) {
		return false
	}
	log.Warn().Str("trace", path).Msg("bench: trace not found, skipping" + what + " (traces live in ../shared/traces; --trace synthetic runs a generated one)")
	return true
}
