package main

import (
	"context"
	"io"
	"os"
	"path/filepath"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/cli"
)

// What the bench commands do around a run: its scratch directory, the
// stop on SIGINT/SIGTERM, its table on stdout and in a file.

// workDir makes a run's scratch directory; done removes it, or with keep
// leaves it (logged at once, to be read while the run goes on).
func workDir(prefix string, keep bool, log *zerolog.Logger) (dir string, done func(), err error) {
	dir, err = os.MkdirTemp("", prefix)
	if err != nil {
		return "", nil, err
	}
	if keep {
		log.Info().Str("dir", dir).Msg("bench: work directory kept")
		return dir, func() {}, nil
	}
	return dir, func() { os.RemoveAll(dir) }, nil
}

// runTable runs a bench until it ends or SIGINT/SIGTERM stops it, then
// writes its rows with write to stdout and to dir/file.
func runTable[R any](dir, file string, run func(context.Context) (R, error), write func(io.Writer, R) error) (R, error) {
	ctx, stop := cli.StopContext()
	defer stop()
	rows, err := run(ctx)
	if err != nil {
		return rows, err
	}
	return rows, teeFile(dir, file, func(w io.Writer) error { return write(w, rows) })
}

// teeFile writes a result table to stdout and to dir/file through write.
func teeFile(dir, file string, write func(io.Writer) error) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, file))
	if err != nil {
		return err
	}
	defer f.Close()
	if err := write(io.MultiWriter(os.Stdout, f)); err != nil {
		return err
	}
	return f.Close()
}
