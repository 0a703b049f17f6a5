package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/cli"
	"github.com/turnout/turnout/lab/bench"
)

var benchScaleCmd = cli.Command{
	Prog:     prog,
	Synopsis: "turnout-lab bench scale [--policies LIST] [--endpoints LIST] [--prompt-kib LIST] [--blocks LIST] [flags]\n       turnout-lab bench scale --kv [--publishers LIST] [--kv-rate N] [--kv-blocks N] [flags]\n       turnout-lab bench scale --background [--replicas LIST] [--fronts LIST] [--share LIST] [flags]\n       turnout-lab bench scale --sync [--fronts LIST] [--rates LIST] [--trace FILE] [flags]",
	About: `Measures the decision core in process, on one goroutine: decisions/s per core, p50/p99 decision time and
allocations for each policy at each pool size and prompt size, and for the prefix-keyed policies with the index
filled to each --blocks size first (its heap per indexed block). docs/scale.md reads these rows.

With --kv, the KV-event axis instead: for each --publishers count, that many mock vLLM publishers (ZMQ PUB,
msgpack EventBatches; "bench kvpub", a process of its own) send --kv-rate events/s in total to turnout's
subscribers and KV index in this process, holding --kv-blocks blocks together; the row is events ingested per
CPU-second of this process and the time of a prefix lookup over every source meanwhile. A first line decodes and
applies the same batches on one goroutine without sockets and reports the index's heap per block.

With --background, the background cost of a fleet instead: N mock replicas in this process, F turnout
processes before them (over one nats-server when F > 1, with engine_metrics.share off and on), at rest
and under a steady stream of decisions: the replicas' requests from turnout by kind (engine scrapes,
which carry the LoRA info too; health checks; /v1/models polls) per replica per second, and turnout's CPU.

With --sync, the cluster sync with real processes instead: one nats-server, F turnout processes with cluster
sync before --sync-replicas mock replicas in this process, and decisions over /internal/route (prompts from
--trace, cut to --sync-prompt-kib, round robin over the fronts) at each --rates total rate, open loop, each
closed over /internal/done after --hold. Per front and per decision of the cluster, over a steady window: NATS
messages and bytes, CPU, and a front's sync CPU against one front's (less idle CPU); the hit ratio from where
each prompt chunk was last sent, and requests max/mean, against one front at the same rate.`,
	Example: "turnout-lab bench scale --policies prefix-affinity --endpoints 64,256,1024 --prompt-kib 8 --blocks 0,1000000\n" +
		"  turnout-lab bench scale --kv --publishers 64,256,1024 --kv-rate 200000\n" +
		"  turnout-lab bench scale --background --replicas 16,64,256,1024 --fronts 1,8\n" +
		"  turnout-lab bench scale --sync --fronts 1,2,4,8 --rates 1000,5000,20000 --trace mooncake_synthetic_trace.jsonl",
}

var benchKVPubCmd = cli.Command{
	Prog:     prog,
	Synopsis: "turnout-lab bench kvpub [--publishers N] [--rate N] [flags]",
	About: `Runs N mock vLLM KV-event publishers (ZMQ PUB on loopback, msgpack EventBatches of BlockStored and
BlockRemoved events, each publisher keeping --held blocks): prints their addresses, one a line, starts sending at
--rate events/s in total when a line arrives on stdin, and stops at EOF. "bench scale --kv" runs it.`,
	Example: "turnout-lab bench kvpub --publishers 64 --rate 200000",
}

func runKVPub(args []string, log *zerolog.Logger) error {
	o := bench.DefaultKVPubOptions()
	fset := cli.NewFlags("bench kvpub")
	kvPubFlags(fset, &o)
	fset.IntVar(&o.Publishers, "publishers", o.Publishers, "publishers")
	fset.IntVar(&o.Rate, "rate", o.Rate, "events per second of all publishers together")
	fset.IntVar(&o.Held, "held", o.Held, "blocks each publisher keeps cached (older ones are removed)")
	if err := cli.ParseFlags(fset, benchKVPubCmd, args); err != nil {
		return err
	}
	ctx, stop := cli.StopContext()
	defer stop()
	pubs, err := bench.StartKVPublishers(ctx, o, log)
	if err != nil {
		return fmt.Errorf("bench kvpub: %w", err)
	}
	defer pubs.Close()
	if err := pubs.WriteAddrs(os.Stdout); err != nil {
		return fmt.Errorf("bench kvpub: %w", err)
	}
	in := bufio.NewReader(os.Stdin)
	if _, err := in.ReadString('\n'); err != nil {
		return nil // stdin closed before the start: nothing to send
	}
	rctx, cancel := context.WithCancel(ctx)
	go func() {
		_, _ = io.Copy(io.Discard, in)
		cancel()
	}()
	pubs.Run(rctx)
	st := pubs.Stats()
	log.Info().Uint64("sent", st.Sent).Uint64("dropped", st.Dropped).Uint64("encode_errors", st.EncodeErrors).Msg("bench kvpub: done")
	return nil
}

// kvPubFlags are the stream's shape, shared by bench kvpub and bench scale --kv.
func kvPubFlags(fset *flag.FlagSet, o *bench.KVPubOptions) {
	fset.IntVar(&o.EventsPerBatch, "events-per-batch", o.EventsPerBatch, "events per EventBatch (one ZMQ message)")
	fset.IntVar(&o.BlocksPerEvent, "blocks-per-event", o.BlocksPerEvent, "blocks named by one event")
	fset.IntVar(&o.BlockSize, "block-size", o.BlockSize, "tokens per block")
	fset.IntVar(&o.ChainEvents, "chain-events", o.ChainEvents, "stored events extending one prefix chain")
}

func runKVScale(pubs string, o bench.KVScaleOptions, out, name string, log *zerolog.Logger) error {
	var err error
	if o.Publishers, err = parseInts(pubs); err != nil {
		return fmt.Errorf("bench scale: --publishers: %w", err)
	}
	o.Log = log
	ctx, stop := cli.StopContext()
	defer stop()
	core, err := bench.RunKVCore(o.Pub, o.Blocks)
	if err != nil {
		return fmt.Errorf("bench scale --kv: %w", err)
	}
	log.Info().Float64("per_core", core.PerCore).Float64("bytes_per_block", core.BytesPerBlock).Msg("kv core")
	rows, err := bench.RunKVScale(ctx, o)
	if err != nil {
		return fmt.Errorf("bench scale --kv: %w", err)
	}
	return teeFile(out, name+"-kv.txt", func(w io.Writer) error { return bench.WriteKVScaleTable(w, core, rows) })
}

func runScale(args []string, log *zerolog.Logger) error {
	d := bench.DefaultScaleOptions()
	fset := cli.NewFlags("bench scale")
	pols := fset.String("policies", strings.Join(d.Policies, ","), "comma-separated turnout policies")
	eps := fset.String("endpoints", ints(d.Endpoints), "comma-separated pool sizes")
	kib := fset.String("prompt-kib", ints(d.PromptKiB), "comma-separated prompt sizes in KiB")
	blocks := fset.String("blocks", ints(d.Blocks), "comma-separated prefix index sizes filled before timing (prefix-keyed policies)")
	fset.IntVar(&d.Decisions, "decisions", d.Decisions, "timed decisions per cell")
	fset.IntVar(&d.Open, "open", d.Open, "decisions kept open per endpoint while timing")
	fset.IntVar(&d.MaxCandidates, "max-candidates", d.MaxCandidates, "the policies' max_candidates (0: the default; above the pool size: no pruning)")
	fset.Uint64Var(&d.Seed, "seed", d.Seed, "seed for the policies")
	out := fset.String("out", "bench-out", "output directory")
	name := fset.String("name", "scale", "output file name prefix")
	ko := bench.DefaultKVScaleOptions()
	kvMode := fset.Bool("kv", false, "measure KV-event ingest instead of decisions (the flags below)")
	pubs := fset.String("publishers", ints(ko.Publishers), "--kv: comma-separated publisher counts")
	fset.IntVar(&ko.Pub.Rate, "kv-rate", ko.Pub.Rate, "--kv: events per second of all publishers together")
	fset.IntVar(&ko.Blocks, "kv-blocks", ko.Blocks, "--kv: blocks the publishers hold together (the index's size)")
	fset.DurationVar(&ko.Duration, "kv-duration", ko.Duration, "--kv: timed ingest per row")
	kvPubFlags(fset, &ko.Pub)
	bg := bench.DefaultBackgroundOptions()
	background := fset.Bool("background", false, "measure the background cost of a fleet (scrapes, health checks, model polls, CPU) instead")
	replicas := fset.String("replicas", ints(bg.Replicas), "--background: comma-separated replica counts")
	fronts := fset.String("fronts", ints(bg.Fronts), "--background, --sync: comma-separated turnout front counts")
	share := fset.String("share", "off,on", "--background: engine_metrics.share settings for the runs of more than one front")
	fset.DurationVar(&bg.Warmup, "warmup", bg.Warmup, "--background: wait before the rest phase")
	fset.DurationVar(&bg.Rest, "rest", bg.Rest, "--background: length of the rest phase")
	fset.DurationVar(&bg.Load, "load", bg.Load, "--background: length of the load phase")
	fset.IntVar(&bg.LoadRPS, "load-rps", 0, "--background: decisions a second in total under load (0 = one per replica a second)")
	tbin := fset.String("turnout-bin", "", "--background, --sync: turnout binary (default: turnout next to this executable, else on $PATH)")
	natsBin := fset.String("nats-server", "nats-server", "--background, --sync: nats-server binary ($PATH, else /usr/sbin)")
	so := bench.DefaultSyncFrontsOptions()
	syncMode := fset.Bool("sync", false, "measure cluster sync with real processes (messages, bytes, CPU per decision per front; hit ratio, balance) instead")
	rates := fset.String("rates", ints(so.Rates), "--sync: comma-separated decisions per second, all fronts together")
	trace := fset.String("trace", "", "--sync: Mooncake JSONL or Azure CSV trace for the prompts (default: a synthetic Mooncake-shaped one)")
	fset.IntVar(&so.Replicas, "sync-replicas", so.Replicas, "--sync: mock replicas in the pool")
	fset.IntVar(&so.PromptKiB, "sync-prompt-kib", so.PromptKiB, "--sync: cut prompts to about this many KiB (0: whole)")
	fset.DurationVar(&so.Rest, "sync-rest", so.Rest, "--sync: idle window measuring each front's CPU at rest")
	fset.DurationVar(&so.Warmup, "sync-warmup", so.Warmup, "--sync: run at the rate this long before the window")
	fset.DurationVar(&so.Window, "sync-window", so.Window, "--sync: the measured window per rate")
	fset.DurationVar(&so.Hold, "hold", so.Hold, "--sync: how long a decision stays open before /internal/done")
	fset.IntVar(&so.Workers, "workers", so.Workers, "--sync: the driver's requests in flight at most")
	if err := cli.ParseFlags(fset, benchScaleCmd, args); err != nil {
		return err
	}
	if *syncMode {
		return runSyncFronts(so, *fronts, *rates, *trace, *tbin, *natsBin, *out, *name, log)
	}
	if *kvMode {
		return runKVScale(*pubs, ko, *out, *name, log)
	}
	if *background {
		return runBackground(bg, *replicas, *fronts, *share, *tbin, *natsBin, *out, *name, log)
	}
	var err error
	d.Policies = strings.Split(*pols, ",")
	if d.Endpoints, err = parseInts(*eps); err != nil {
		return fmt.Errorf("bench scale: --endpoints: %w", err)
	}
	if d.PromptKiB, err = parseInts(*kib); err != nil {
		return fmt.Errorf("bench scale: --prompt-kib: %w", err)
	}
	if d.Blocks, err = parseInts(*blocks); err != nil {
		return fmt.Errorf("bench scale: --blocks: %w", err)
	}
	d.Log = log
	_, err = runTable(*out, *name+".txt", func(ctx context.Context) ([]bench.ScaleRow, error) { return bench.RunScale(ctx, d) }, bench.WriteScaleTable)
	if err != nil {
		return fmt.Errorf("bench scale: %w", err)
	}
	return nil
}

func runBackground(o bench.BackgroundOptions, replicas, fronts, share, tbin, natsBin, out, name string, log *zerolog.Logger) error {
	var err error
	if o.Replicas, err = parseInts(replicas); err != nil {
		return fmt.Errorf("bench scale: --replicas: %w", err)
	}
	if o.Fronts, err = parseInts(fronts); err != nil {
		return fmt.Errorf("bench scale: --fronts: %w", err)
	}
	if o.Share, err = bench.ParseBools(share); err != nil {
		return fmt.Errorf("bench scale: --share: %w", err)
	}
	o.NATSServer, o.Log = natsBin, log
	return runProcBench("background", tbin, out, name, func(ctx context.Context, dir, turnout string) ([]bench.BackgroundRow, error) {
		o.Dir, o.Turnout = dir, turnout
		return bench.RunBackground(ctx, o)
	}, bench.WriteBackgroundTable)
}

// runProcBench runs a bench of turnout processes (the binary of
// --turnout-bin) in a scratch directory and writes its rows to the
// terminal and OUT/NAME-MODE.txt, also after an error (the rows so far).
func runProcBench[R any](mode, tbin, out, name string, run func(ctx context.Context, dir, turnout string) (R, error), write func(io.Writer, R) error) error {
	turnout, _, err := binaries(tbin)
	if err != nil {
		return fmt.Errorf("bench scale: %w", err)
	}
	dir, err := os.MkdirTemp("", "turnout-"+mode+"-")
	if err != nil {
		return fmt.Errorf("bench scale: %w", err)
	}
	defer os.RemoveAll(dir)
	ctx, stop := cli.StopContext()
	defer stop()
	rows, err := run(ctx, dir, turnout)
	if werr := teeFile(out, name+"-"+mode+".txt", func(w io.Writer) error { return write(w, rows) }); werr != nil && err == nil {
		err = werr
	}
	if err != nil {
		return fmt.Errorf("bench scale --%s: %w", mode, err)
	}
	return nil
}

func runSyncFronts(o bench.SyncFrontsOptions, fronts, rates, trace, tbin, natsBin, out, name string, log *zerolog.Logger) error {
	var err error
	if o.Fronts, err = bench.ParseFronts(fronts); err != nil {
		return fmt.Errorf("bench scale: --fronts: %w", err)
	}
	if o.Rates, err = parseInts(rates); err != nil {
		return fmt.Errorf("bench scale: --rates: %w", err)
	}
	if trace == "" {
		o.Trace = bench.SyntheticTrace(4000, 1)
	} else if o.Trace, err = bench.LoadTrace(trace, bench.TraceOptions{}); err != nil {
		return fmt.Errorf("bench scale: %w", err)
	}
	o.NATSServer, o.Log = natsBin, log
	return runProcBench("sync", tbin, out, name, func(ctx context.Context, dir, turnout string) ([]bench.SyncFrontsRow, error) {
		o.Dir, o.Turnout = dir, turnout
		return bench.RunSyncFronts(ctx, o)
	}, bench.WriteSyncFrontsTable)
}

func ints(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

func parseInts(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%q is not a whole number", f)
		}
		out = append(out, n)
	}
	return out, nil
}
