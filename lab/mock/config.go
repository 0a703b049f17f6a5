package mock

import (
	"fmt"
	"time"
)

// Role is the replica's place in prefill/decode disaggregation.
type Role string

// Roles, named like vLLM's kv_role intent.
const (
	RoleMixed   Role = "mixed"   // ordinary replica; kv_transfer_params ignored
	RolePrefill Role = "prefill" // answers do_remote_decode requests with transfer params
	RoleDecode  Role = "decode"  // consumes do_remote_prefill transfer params
)

// ParseRole validates a role name; "" means mixed.
func ParseRole(s string) (Role, error) {
	switch Role(s) {
	case "", RoleMixed:
		return RoleMixed, nil
	case RolePrefill, RoleDecode:
		return Role(s), nil
	}
	return "", fmt.Errorf("unknown role %q (want mixed, prefill or decode)", s)
}

// Config holds every knob of a mock replica. Start from DefaultConfig; New
// also fills zero values that would be meaningless (see each field).
type Config struct {
	// Name identifies the replica: X-Replica header, ids, engine id. Default "mock".
	Name string
	// Models served (/v1/models); the first is the default and the metrics
	// label. Default ["llama"].
	Models []string
	// StrictModels rejects requests naming another model with vLLM's 404;
	// otherwise any model name is accepted and echoed.
	StrictModels bool

	// Role for prefill/decode disaggregation. Default mixed.
	Role Role
	// EngineID is reported as remote_engine_id by a prefill replica. Default Name.
	EngineID string
	// AdvertiseHost/Port are reported as remote_host/remote_port by a prefill
	// replica. Default: the listener's address (127.0.0.1 if it is a wildcard).
	AdvertiseHost string
	AdvertisePort int

	// BlockSize is tokens per KV block. Default 16.
	BlockSize int
	// CacheBlocks is the prefix cache capacity in blocks. Default 4096.
	CacheBlocks int
	// MaxModelLen is only reported by /tokenize and /v1/models. Default 8192.
	MaxModelLen int

	// Timing model; see Timing. TimeScale multiplies all of them; 0 means no
	// sleeping at all (throughput benchmarks).
	TTFTOverhead      time.Duration
	PerTokenPrefill   time.Duration
	InterTokenLatency time.Duration
	TimeScale         float64
	// MaxRunning bounds concurrently running sequences; the rest wait FIFO.
	// 0 means unlimited.
	MaxRunning int
	// MaxTokensDefault is used when a request sets neither max_tokens nor
	// max_completion_tokens. Default 16.
	MaxTokensDefault int

	// Initial fault knobs; switchable at runtime via SetFaults or POST /mock/faults.
	// FailRate is the fraction of completion requests answered 500.
	FailRate float64
	// Stall holds each completion request before anything else happens. It is
	// real time: NOT multiplied by TimeScale, so it reliably trips timeouts.
	Stall time.Duration
	// DieAfterChunks > 0 aborts streaming responses after that many SSE
	// events, without [DONE] and without the final HTTP chunk.
	DieAfterChunks int
	// Unhealthy makes /health answer 503.
	Unhealthy bool
	// Seed drives the FailRate draws so failures are reproducible.
	Seed uint64

	// RequestLogSize is how many recent requests /mock/requests keeps.
	// Default 256; negative disables the log.
	RequestLogSize int
	// MaxRequestBodySize bounds request bodies. Default 64 MiB.
	MaxRequestBodySize int

	// KVEvents, if set, receives the prefix cache's KV events.
	KVEvents KVEventSink
	// TokenIDOffset is added (mod 2^32) to every token id /tokenize answers
	// and KV events carry; 1<<31 emulates ids that do not fit in int32.
	TokenIDOffset uint32

	// LoRA adapters (lora.go): LoRAModules are registered at start;
	// EnableLoRA (implied by LoRAModules) also allows runtime loading and
	// exports vllm:lora_requests_info. MaxLoRAs adapters are hot at once
	// (default 1, vLLM's); a request whose adapter is not hot waits
	// LoRALoadCost (scaled by TimeScale) before its first token.
	LoRAModules  []LoRAModule
	EnableLoRA   bool
	MaxLoRAs     int
	LoRALoadCost time.Duration
}

// DefaultConfig returns realistic single-GPU-ish timings at full scale:
// 20 ms TTFT overhead, 50 µs per prefilled token, 20 ms ITL, 256 running.
func DefaultConfig() Config {
	return Config{
		Name:               "mock",
		Models:             []string{"llama"},
		Role:               RoleMixed,
		BlockSize:          16,
		CacheBlocks:        4096,
		MaxModelLen:        8192,
		TTFTOverhead:       20 * time.Millisecond,
		PerTokenPrefill:    50 * time.Microsecond,
		InterTokenLatency:  20 * time.Millisecond,
		TimeScale:          1,
		MaxRunning:         256,
		MaxTokensDefault:   16,
		Seed:               1,
		RequestLogSize:     256,
		MaxRequestBodySize: 64 << 20,
	}
}

// Timing returns the config's latency model.
func (c Config) Timing() Timing {
	return Timing{
		TTFTOverhead:      c.TTFTOverhead,
		PerTokenPrefill:   c.PerTokenPrefill,
		InterTokenLatency: c.InterTokenLatency,
		TimeScale:         c.TimeScale,
	}
}

// Faults are the runtime-switchable fault knobs (see the Config fields of the
// same names).
type Faults struct {
	FailRate       float64
	Stall          time.Duration
	DieAfterChunks int
	Unhealthy      bool
	// ShuttingDown answers every completion request 503 "server shutting
	// down" at once, as a dying vLLM does to requests it just accepted
	// (runtime only).
	ShuttingDown bool
	// StallSpare: a completion request whose body contains it is not
	// stalled, so a replica can stall most requests and answer some in time
	// (runtime only; the stall probes of a router never carry it).
	StallSpare string
}

func (c *Config) normalize() error {
	d := DefaultConfig()
	if c.Name == "" {
		c.Name = d.Name
	}
	if len(c.Models) == 0 {
		c.Models = d.Models
	}
	for _, m := range c.Models {
		if m == "" {
			return fmt.Errorf("empty model name in %q", c.Models)
		}
	}
	r, err := ParseRole(string(c.Role))
	if err != nil {
		return err
	}
	c.Role = r
	if c.EngineID == "" {
		c.EngineID = c.Name
	}
	if c.BlockSize <= 0 {
		c.BlockSize = d.BlockSize
	}
	if c.CacheBlocks <= 0 {
		c.CacheBlocks = d.CacheBlocks
	}
	if c.MaxModelLen <= 0 {
		c.MaxModelLen = d.MaxModelLen
	}
	if len(c.LoRAModules) > 0 {
		c.EnableLoRA = true
	}
	if c.MaxLoRAs <= 0 {
		c.MaxLoRAs = 1
	}
	if c.MaxTokensDefault <= 0 {
		c.MaxTokensDefault = d.MaxTokensDefault
	}
	if c.RequestLogSize == 0 {
		c.RequestLogSize = d.RequestLogSize
	}
	if c.MaxRequestBodySize <= 0 {
		c.MaxRequestBodySize = d.MaxRequestBodySize
	}
	if c.FailRate < 0 || c.FailRate > 1 {
		return fmt.Errorf("fail rate %v outside [0,1]", c.FailRate)
	}
	if c.TimeScale < 0 || c.TTFTOverhead < 0 || c.PerTokenPrefill < 0 || c.InterTokenLatency < 0 || c.Stall < 0 {
		return fmt.Errorf("negative duration or time scale")
	}
	return nil
}
