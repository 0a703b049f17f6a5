package main

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/cli"

	"github.com/turnout/turnout/lab/mock"
	"github.com/turnout/turnout/route/kv"
)

// modelList is a repeatable, comma-splitting flag value.
type modelList []string

func (m *modelList) String() string { return strings.Join(*m, ",") }

func (m *modelList) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*m = append(*m, s)
		}
	}
	return nil
}

// runMock implements `turnout-lab mock`: one mock vLLM replica serving until
// SIGINT/SIGTERM.
func runMock(args []string, log *zerolog.Logger) error {
	d := mock.DefaultConfig()
	fs := cli.NewFlags("mock")
	var (
		models modelList
		role   string
		cfg    = d
	)
	listen := fs.String("listen", ":8000", "listen address")
	fs.StringVar(&cfg.Name, "name", "", "replica name for X-Replica (default mock-PORT)")
	fs.Var(&models, "model", "served model name; repeatable or comma-separated (default llama)")
	fs.BoolVar(&cfg.StrictModels, "strict-models", false, "answer 404 for unknown model names")
	fs.StringVar(&role, "role", string(mock.RoleMixed), "mixed, prefill or decode")
	fs.StringVar(&cfg.EngineID, "engine-id", "", "remote_engine_id a prefill replica reports (default: name)")
	fs.StringVar(&cfg.AdvertiseHost, "advertise-host", "", "remote_host a prefill replica reports (default: listen host)")
	fs.IntVar(&cfg.BlockSize, "block-size", d.BlockSize, "tokens per KV block")
	fs.IntVar(&cfg.CacheBlocks, "cache-blocks", d.CacheBlocks, "prefix cache capacity in blocks")
	fs.IntVar(&cfg.MaxModelLen, "max-model-len", d.MaxModelLen, "max_model_len reported by /tokenize")
	fs.DurationVar(&cfg.TTFTOverhead, "ttft-overhead", d.TTFTOverhead, "fixed time to first token")
	fs.DurationVar(&cfg.PerTokenPrefill, "per-token-prefill", d.PerTokenPrefill, "prefill time per uncached prompt token")
	fs.DurationVar(&cfg.InterTokenLatency, "itl", d.InterTokenLatency, "inter-token latency")
	fs.IntVar(&cfg.MaxRunning, "max-running", d.MaxRunning, "max concurrently running sequences (0 = unlimited)")
	fs.Float64Var(&cfg.TimeScale, "time-scale", d.TimeScale, "multiplier for all model durations (0 = never sleep)")
	fs.IntVar(&cfg.MaxTokensDefault, "max-tokens-default", d.MaxTokensDefault, "completion tokens when the request sets none")
	fs.Float64Var(&cfg.FailRate, "fail-rate", 0, "fraction of completion requests answered 500")
	fs.DurationVar(&cfg.Stall, "stall", 0, "hold each completion request this long first (real time, not scaled)")
	fs.IntVar(&cfg.DieAfterChunks, "die-after-chunks", 0, "abort streams after this many SSE events (0 = never)")
	fs.BoolVar(&cfg.Unhealthy, "unhealthy", false, "start with /health answering 503")
	fs.Uint64Var(&cfg.Seed, "seed", d.Seed, "seed for fail-rate draws")
	fs.IntVar(&cfg.RequestLogSize, "request-log-size", d.RequestLogSize, "requests kept for /mock/requests (negative disables)")
	kvAddr := fs.String("kv-events", "", "publish vLLM KV-cache events on this ZMQ PUB address, bound (e.g. tcp://127.0.0.1:5557; vLLM with a wildcard endpoint)")
	kvConnect := fs.String("kv-events-connect", "", "publish KV-cache events by connecting to this address, where a subscriber binds (vLLM with a concrete endpoint, llm-d)")
	kvParentZero := fs.Bool("kv-parent-zero", false, "send a first block's parent hash as 0 instead of nil (llm-d's publishers)")
	idOffset := fs.Uint("token-id-offset", 0, "add this to every token id /tokenize and KV events report (2147483648 emulates ids >= 2^31)")
	kvTopic := fs.String("kv-topic", "", "ZMQ topic for KV events (with --kv-events-connect default kv@HOST:PORT@MODEL of --listen)")
	kvReplay := fs.String("kv-replay", "", "serve vLLM's replay ROUTER socket on this address")
	kvBytes := fs.Bool("kv-hash-bytes", false, "encode block hashes as 32-byte strings (newer vLLM) instead of ints")
	kvMap := fs.Bool("kv-map-events", false, "encode events as maps (vLLM after array_like was dropped)")
	loraMods := fs.String("lora-modules", "", "LoRA adapters served from the start, name=path,... (vLLM's --lora-modules); listed in /v1/models with the first --model as parent")
	fs.BoolVar(&cfg.EnableLoRA, "enable-lora", false, "serve LoRA adapters (implied by --lora-modules): POST /v1/load_lora_adapter and /v1/unload_lora_adapter, vllm:lora_requests_info")
	fs.IntVar(&cfg.MaxLoRAs, "max-loras", 1, "adapters hot at once (an LRU); a request for another waits --lora-load-cost")
	fs.DurationVar(&cfg.LoRALoadCost, "lora-load-cost", 200*time.Millisecond, "time to load an adapter that is not hot, before the first token (scaled by --time-scale)")
	if err := cli.ParseFlags(fs, mockCmd, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("mock: unexpected arguments %q", fs.Args())
	}
	r, err := mock.ParseRole(role)
	if err != nil {
		return fmt.Errorf("mock: %w", err)
	}
	cfg.Role = r
	if cfg.LoRAModules, err = mock.ParseLoRAModules(*loraMods); err != nil {
		return fmt.Errorf("mock: --lora-modules: %w", err)
	}
	cfg.Models = models
	if len(cfg.Models) == 0 {
		cfg.Models = d.Models
	}

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("mock: listen %s: %w", *listen, err)
	}
	if cfg.Name == "" {
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		cfg.Name = "mock-" + port
	}
	ctx, stop := cli.StopContext()
	defer stop()
	if *idOffset > 1<<32-1 {
		_ = ln.Close()
		return fmt.Errorf("mock: --token-id-offset %d beyond uint32", *idOffset)
	}
	cfg.TokenIDOffset = uint32(*idOffset)
	if *kvAddr != "" && *kvConnect != "" {
		_ = ln.Close()
		return errors.New("mock: --kv-events (bind) and --kv-events-connect are exclusive")
	}
	if *kvConnect != "" && *kvTopic == "" {
		// llm-d's convention, which turnout's bind mode expects by default.
		a := ln.Addr().(*net.TCPAddr)
		host := a.IP.String()
		if a.IP.IsUnspecified() {
			host = "127.0.0.1"
		}
		*kvTopic = "kv@" + net.JoinHostPort(host, strconv.Itoa(a.Port)) + "@" + cfg.Models[0]
	}
	if *kvAddr != "" || *kvConnect != "" {
		pub, err := kv.NewPublisherWithConfig(ctx, kv.PublisherConfig{
			Addr: *kvAddr, Connect: *kvConnect, Topic: *kvTopic, ReplayAddr: *kvReplay,
			Encoding: kv.EncodeOptions{HashAsBytes: *kvBytes, MapEvents: *kvMap, ZeroParent: *kvParentZero},
		}, log)
		if err != nil {
			_ = ln.Close()
			return fmt.Errorf("mock: kv events: %w", err)
		}
		defer func() { _ = pub.Close() }()
		cfg.KVEvents = pub
	}
	srv, err := mock.New(cfg, log)
	if err != nil {
		_ = ln.Close()
		return fmt.Errorf("mock: %w", err)
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info().Str("listen", ln.Addr().String()).Str("name", cfg.Name).Strs("models", cfg.Models).
		Str("role", string(cfg.Role)).Float64("time_scale", cfg.TimeScale).Msg("mock vLLM replica serving")

	select {
	case err := <-errc:
		_ = srv.Close()
		if err != nil {
			return fmt.Errorf("mock: %w", err)
		}
		return nil
	case <-ctx.Done():
	}
	log.Info().Msg("mock: shutting down")
	if err := srv.Close(); err != nil {
		return fmt.Errorf("mock: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("mock: %w", err)
	}
	return nil
}
