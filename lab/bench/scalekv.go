package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/route/kv"
)

// The KV-event axis of the scale envelope (docs/scale.md): turnout's
// subscribers (route/kv's Manager, one ZMQ SUB per publisher) and its
// index ingest the stream of N mock publishers running in another process
// (KVPublishers), and the row reports events ingested per CPU-second of
// the ingesting process, the index's size, and how long a prefix lookup
// over every source takes meanwhile. Beside it, the same batches decoded
// and applied on one goroutine without sockets (the code's own ceiling)
// and the index's heap per block.

// KVScaleOptions chooses the rows of RunKVScale.
type KVScaleOptions struct {
	Publishers []int
	Pub        KVPubOptions // Publishers is set per row; Held from Blocks
	// Blocks is what all publishers hold together once warm (the index's
	// size while timing).
	Blocks   int
	Duration time.Duration // timed ingest per row
	Warmup   time.Duration // bound on the wait for the index to fill
	// LookupEvery paces the lookups timed while ingesting.
	LookupEvery time.Duration
	// Bin is the turnout-lab binary that runs the publishers ("bench kvpub").
	Bin string
	Log *zerolog.Logger
}

// DefaultKVScaleOptions are docs/scale.md's KV rows.
func DefaultKVScaleOptions() KVScaleOptions {
	return KVScaleOptions{Publishers: []int{64, 256, 1024}, Pub: DefaultKVPubOptions(), Blocks: 1 << 20, Duration: 10 * time.Second, Warmup: 60 * time.Second, LookupEvery: time.Millisecond}
}

// KVScaleRow is one publisher count's result.
type KVScaleRow struct {
	Publishers int
	Rate       int     // events/s asked of the publishers
	EventsPerS float64 // events ingested per wall second
	Cores      float64 // CPU of the ingesting process, in cores
	// PerCore is events ingested per CPU-second of the ingesting process
	// without the paced lookups' own CPU (their thread's clock); WithLookups
	// counts that in.
	PerCore, WithLookups float64
	LookupCores          float64 // the paced lookups' CPU, in cores
	Gaps                 uint64  // sequence gaps and malformed messages while timing
	Blocks               int     // index entries at the end
	// LookupP50Us and LookupP99Us time one MatchIDs of a 32-block prompt
	// over every source while ingesting.
	LookupP50Us, LookupP99Us float64
	Lookups                  int
	Err                      string
}

// KVCoreResult is the ingest code without sockets: decode + apply on one
// goroutine, and the index's heap per block.
type KVCoreResult struct {
	Events        int
	PerCore       float64 // events decoded and applied per second on one goroutine
	DecodeShare   float64 // the part of that time spent decoding
	Blocks        int
	BytesPerBlock float64 // heap growth per indexed block
	ApproxPerBlk  float64 // the index's own estimate (IndexStats.ApproxBytes)
}

// timedEvents is how many steady-state events RunKVCore times.
const timedEvents = 1 << 19

// RunKVCore fills an index to blocks with o's stream (o.Held is set from
// blocks), then times decode + apply of the stream's steady state in
// process: stores of new blocks and removals of the oldest.
func RunKVCore(o KVPubOptions, blocks int) (KVCoreResult, error) {
	o.Held = max(1, blocks/max(1, o.Publishers))
	if err := o.check(); err != nil {
		return KVCoreResult{}, err
	}
	var res KVCoreResult
	// The publishers' side (encoding) is never timed.
	streams := make([]*kvStream, o.Publishers)
	for i := range streams {
		streams[i] = newKVStream(o, i)
	}
	type msg struct {
		src     string
		payload []byte
	}
	names := make([]string, o.Publishers)
	for i := range names {
		names[i] = "r" + strconv.Itoa(i)
	}
	// encode makes batches round the publishers until done(events so far).
	encode := func(done func(events int) bool) ([]msg, error) {
		var out []msg
		events := 0
		for i := 0; !done(events); i++ {
			s := i % len(streams)
			evs := streams[s].batch()
			p, err := kv.EncodeBatch(kv.Batch{TS: 1, Events: evs, HasDPRank: true}, false)
			if err != nil {
				return nil, fmt.Errorf("kv core: encode: %w", err)
			}
			out = append(out, msg{names[s], p})
			events += len(evs)
		}
		return out, nil
	}
	stored := func() int {
		n := 0
		for _, s := range streams {
			n += len(s.held) - s.head
		}
		return n
	}
	// One Decoder, as one subscriber reuses its own.
	var dec kv.Decoder
	apply := func(idx *kv.Index, ms []msg) (n int, decode time.Duration, err error) {
		for _, m := range ms {
			t0 := time.Now()
			b, err := dec.Decode(m.payload)
			decode += time.Since(t0)
			if err != nil {
				return n, decode, fmt.Errorf("kv core: decode: %w", err)
			}
			idx.Apply(m.src, b)
			n += len(b.Events)
		}
		return n, decode, nil
	}
	runtime.GC()
	var m0 runtime.MemStats
	runtime.ReadMemStats(&m0)
	idx := kv.NewIndex(2 * blocks)
	// Filled batch by batch, so the heap holds the index and not the fill.
	for i := 0; stored() < blocks; i++ {
		s := i % len(streams)
		p, err := kv.EncodeBatch(kv.Batch{TS: 1, Events: streams[s].batch(), HasDPRank: true}, false)
		if err != nil {
			return res, fmt.Errorf("kv core: encode: %w", err)
		}
		if _, _, err := apply(idx, []msg{{names[s], p}}); err != nil {
			return res, err
		}
	}
	runtime.GC()
	var m1 runtime.MemStats
	runtime.ReadMemStats(&m1)
	st := idx.Stats()
	res.Blocks = st.Entries
	if st.Entries > 0 {
		res.BytesPerBlock = (float64(m1.HeapAlloc) - float64(m0.HeapAlloc)) / float64(st.Entries)
		res.ApproxPerBlk = float64(st.ApproxBytes) / float64(st.Entries)
	}
	// Steady state: stores and removals, each publisher at its share.
	timed, err := encode(func(n int) bool { return n >= timedEvents })
	if err != nil {
		return res, err
	}
	// CPU time, not wall: on a shared box the wall clock counts others' work.
	cpu0, err := selfCPU()
	if err != nil {
		return res, err
	}
	start := time.Now()
	n, decode, err := apply(idx, timed)
	if err != nil {
		return res, err
	}
	wall := time.Since(start)
	cpu1, err := selfCPU()
	if err != nil {
		return res, err
	}
	res.Events = n
	res.PerCore = float64(n) / (cpu1 - cpu0).Seconds()
	res.DecodeShare = decode.Seconds() / wall.Seconds()
	runtime.KeepAlive(idx)
	return res, nil
}

// RunKVScale runs one row per publisher count.
func RunKVScale(ctx context.Context, o KVScaleOptions) ([]KVScaleRow, error) {
	if len(o.Publishers) == 0 || o.Blocks <= 0 || o.Duration <= 0 {
		return nil, errors.New("bench scale --kv: publishers, blocks and duration are required")
	}
	if o.Bin == "" {
		bin, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("bench scale --kv: %w", err)
		}
		o.Bin = bin
	}
	var rows []KVScaleRow
	for _, n := range o.Publishers {
		if err := ctx.Err(); err != nil {
			return rows, err
		}
		r, err := kvScaleRow(ctx, o, n)
		if err != nil {
			r.Err = err.Error()
		}
		if o.Log != nil {
			o.Log.Info().Int("publishers", n).Float64("events_per_s", r.EventsPerS).Float64("per_core", r.PerCore).
				Float64("lookup_p99_us", r.LookupP99Us).Str("err", r.Err).Msg("kv scale row")
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// KVPubArgs are the `bench kvpub` flags for o.
func KVPubArgs(o KVPubOptions) []string {
	return []string{"bench", "kvpub",
		"--publishers", strconv.Itoa(o.Publishers), "--rate", strconv.Itoa(o.Rate),
		"--events-per-batch", strconv.Itoa(o.EventsPerBatch), "--blocks-per-event", strconv.Itoa(o.BlocksPerEvent),
		"--block-size", strconv.Itoa(o.BlockSize), "--held", strconv.Itoa(o.Held), "--chain-events", strconv.Itoa(o.ChainEvents)}
}

func kvScaleRow(ctx context.Context, o KVScaleOptions, n int) (KVScaleRow, error) {
	row := KVScaleRow{Publishers: n, Rate: o.Pub.Rate}
	po := o.Pub
	po.Publishers = n
	po.Held = max(1, o.Blocks/n)
	if err := po.check(); err != nil {
		return row, err
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := exec.CommandContext(cctx, o.Bin, KVPubArgs(po)...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return row, fmt.Errorf("publishers: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return row, fmt.Errorf("publishers: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return row, fmt.Errorf("publishers: %w", err)
	}
	defer func() {
		_ = stdin.Close() // the publishers stop at EOF
		_ = cmd.Wait()
	}()
	var eps []kv.Endpoint
	sc := bufio.NewScanner(stdout)
	for len(eps) < n && sc.Scan() {
		eps = append(eps, kv.Endpoint{Name: "r" + strconv.Itoa(len(eps)), Address: strings.TrimSpace(sc.Text())})
	}
	if len(eps) < n {
		return row, fmt.Errorf("publishers: %d addresses of %d (%v)", len(eps), n, sc.Err())
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()

	nop := zerolog.Nop()
	idx := kv.NewIndex(2 * o.Blocks)
	mgr := kv.NewManager(cctx, idx, kv.ManagerConfig{}, &nop)
	defer mgr.Close()
	if err := mgr.Sync(eps); err != nil {
		return row, fmt.Errorf("subscribers: %w", err)
	}
	if err := waitFor(cctx, 60*time.Second, func() bool {
		for _, st := range mgr.Stats() {
			if !st.Connected {
				return false
			}
		}
		return true
	}); err != nil {
		return row, fmt.Errorf("subscribers: not all connected: %w", err)
	}
	// The SUB side subscribes after connecting; a batch sent before that
	// is lost to the subscriber, which only costs the chains it starts.
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		return row, fmt.Errorf("publishers: %w", err)
	}
	_ = waitFor(cctx, o.Warmup, func() bool { return idx.Stats().Entries >= o.Blocks*9/10 })

	ids := make([]int, n)
	for i, ep := range eps {
		ids[i] = idx.SourceID(ep.Name)
	}
	sum := func() (events, gaps uint64) {
		for _, st := range mgr.Stats() {
			events += st.Events
			gaps += st.Gaps + st.Malformed
		}
		return events, gaps
	}
	ev0, gap0 := sum()
	cpu0, err := selfCPU()
	if err != nil {
		return row, err
	}
	t0 := time.Now()
	lookups, lookupCPU := timeLookups(cctx, idx, ids, o.LookupEvery, o.Duration)
	wall := time.Since(t0)
	cpu1, err := selfCPU()
	if err != nil {
		return row, err
	}
	ev1, gap1 := sum()
	// The paced lookups run in this process too; their cost grows with
	// the sources (each lookup probes every one), not with the events,
	// so the ingest's rate leaves it out and WithLookups counts it in.
	cpu := (cpu1 - cpu0).Seconds()
	row.EventsPerS = float64(ev1-ev0) / wall.Seconds()
	row.Cores = cpu / wall.Seconds()
	row.LookupCores = lookupCPU.Seconds() / wall.Seconds()
	if cpu > 0 {
		row.WithLookups = float64(ev1-ev0) / cpu
	}
	if ingest := cpu - lookupCPU.Seconds(); ingest > 0 {
		row.PerCore = float64(ev1-ev0) / ingest
	}
	row.Gaps = gap1 - gap0
	row.Blocks = idx.Stats().Entries
	if len(lookups) > 0 {
		slices.Sort(lookups)
		row.Lookups = len(lookups)
		row.LookupP50Us = lookups[len(lookups)/2] / 1e3
		row.LookupP99Us = lookups[len(lookups)*99/100] / 1e3
	}
	if ev1 == ev0 {
		return row, errors.New("no events ingested while timing")
	}
	return row, nil
}

// timeLookups matches a 32-block prompt against every source every
// `every` for d, returning each lookup's time in ns and the CPU time of
// the thread it held meanwhile.
func timeLookups(ctx context.Context, idx *kv.Index, ids []int, every, d time.Duration) (times []float64, cpu time.Duration) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpu0 := threadCPU()
	defer func() { cpu = threadCPU() - cpu0 }()
	rnd := rand.New(rand.NewPCG(1, 2))
	keys := make([]uint64, 32)
	out := make([]int, len(ids))
	tick := time.NewTicker(max(every, 10*time.Microsecond))
	defer tick.Stop()
	end := time.After(d)
	for {
		select {
		case <-ctx.Done():
			return times, 0
		case <-end:
			return times, 0
		case <-tick.C:
		}
		for i := range keys {
			keys[i] = rnd.Uint64()
		}
		t0 := time.Now()
		idx.MatchIDs(keys, ids, out)
		times = append(times, float64(time.Since(t0).Nanoseconds()))
	}
}

// waitFor polls cond every 50 ms until it holds or d passes.
func waitFor(ctx context.Context, d time.Duration, cond func() bool) error {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s", d)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// WriteKVScaleTable prints the in-process line and the rows.
func WriteKVScaleTable(w io.Writer, core KVCoreResult, rows []KVScaleRow) error {
	fmt.Fprintf(w, "in process, one goroutine: %d events decoded and applied at %.0f events/s (decoding %.0f %% of it); index of %d blocks: %.1f B/block of heap (its own estimate %.1f), %.1f MiB per 1M blocks\n\n",
		core.Events, core.PerCore, 100*core.DecodeShare, core.Blocks, core.BytesPerBlock, core.ApproxPerBlk, core.BytesPerBlock*1e6/(1<<20))
	return writeTable(w, "publishers\trate asked\tevents/s\tcores\tevents/s/core\twith lookups\tlookup cores\tgaps\tindex blocks\tlookups\tlookup p50 µs\tp99 µs\terror\t", len(rows), func(tw io.Writer, i int) {
		r := &rows[i]
		fmt.Fprintf(tw, "%d\t%d\t%.0f\t%.2f\t%.0f\t%.0f\t%.3f\t%d\t%d\t%d\t%.1f\t%.1f\t%s\t\n",
			r.Publishers, r.Rate, r.EventsPerS, r.Cores, r.PerCore, r.WithLookups, r.LookupCores, r.Gaps, r.Blocks, r.Lookups, r.LookupP50Us, r.LookupP99Us, r.Err)
	})
}
