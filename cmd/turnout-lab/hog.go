package main

import (
	"context"
	"fmt"
	"runtime"
	"sync"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/cli"
)

var hogCmd = cli.Command{
	Prog:     prog,
	Synopsis: "turnout-lab hog [--cpus N] [--for DURATION]",
	About: `Burns CPU on N threads until stopped (SIGINT/SIGTERM) or for a duration: the busy machine the
timing-sensitive e2e tests must also pass beside (make test-hog). Each thread spins on arithmetic, no system
calls, so it competes for the cores the way a compiler or another tenant's job does.`,
	Example: "turnout-lab hog --cpus 2 --for 5m",
}

// runHog implements `turnout-lab hog`.
func runHog(args []string, log *zerolog.Logger) error {
	fs := cli.NewFlags("hog")
	cpus := fs.Int("cpus", runtime.NumCPU(), "threads to keep busy")
	dur := fs.Duration("for", 0, "stop after this long (0: until SIGINT/SIGTERM)")
	if err := cli.ParseFlags(fs, hogCmd, args); err != nil {
		return err
	}
	if *cpus < 1 || *dur < 0 {
		return fmt.Errorf("hog: --cpus must be at least 1 and --for not negative")
	}
	ctx, stop := cli.StopContext()
	defer stop()
	if *dur > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *dur)
		defer cancel()
	}
	if runtime.GOMAXPROCS(0) < *cpus+1 {
		runtime.GOMAXPROCS(*cpus + 1) // one P left for the stop signal
	}
	log.Info().Int("cpus", *cpus).Dur("for", *dur).Msg("hog: burning CPU")
	spins := hog(ctx, *cpus)
	log.Info().Uint64("spins", spins).Msg("hog: stopped")
	return nil
}

// hog keeps n threads busy until ctx is done and returns how many spin
// rounds they ran (so the loop is not optimised away, and a test can see
// it worked).
func hog(ctx context.Context, n int) uint64 {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total uint64
		sink  uint64 // the spins' result, read so the loop stays
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			var x, rounds uint64 = 1, 0
			for ctx.Err() == nil {
				for range 1 << 16 {
					x = x*6364136223846793005 + 1442695040888963407
				}
				rounds++
			}
			mu.Lock()
			total += rounds
			sink ^= x
			mu.Unlock()
		}()
	}
	wg.Wait()
	if sink == 0 {
		total++ // never in practice: x is odd after every round
	}
	return total
}
