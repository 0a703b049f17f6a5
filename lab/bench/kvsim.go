package bench

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/lab/mock"
	"github.com/turnout/turnout/route/kv"
	"github.com/turnout/turnout/route/policy"
)

// CacheWatcher is implemented by routers that learn from the replicas' KV
// cache events (kv-aware): the sim connects each replica's cache to it.
type CacheWatcher interface {
	CacheSink(replica int) mock.KVEventSink
}

// kvSink turns a simulated replica's cache events into the kv-aware index's
// input, as the ZMQ subscriber would, but synchronously: the sim's index is
// never behind the caches (the real one lags by the event delivery time).
type kvSink struct {
	idx *kv.Index
	src string
}

func (s kvSink) BlocksStored(hashes []uint64, parent uint64, hasParent bool, tokens []uint32, blockSize int) {
	s.idx.Apply(s.src, kv.Batch{Events: []kv.Event{{
		Kind: kv.EventBlockStored, BlockHashes: hashes, ParentHash: parent, HasParent: hasParent,
		TokenIDs: tokens, BlockSize: blockSize,
	}}})
}

func (s kvSink) BlocksRemoved(hashes []uint64) {
	s.idx.Apply(s.src, kv.Batch{Events: []kv.Event{{Kind: kv.EventBlockRemoved, BlockHashes: hashes}}})
}

func (s kvSink) AllBlocksCleared() {
	s.idx.Apply(s.src, kv.Batch{Events: []kv.Event{{Kind: kv.EventAllBlocksCleared}}})
}

// CacheSink implements CacheWatcher for kv-aware.
func (t *turnoutRouter) CacheSink(replica int) mock.KVEventSink {
	if t.kvIndex == nil {
		return nil
	}
	return kvSink{idx: t.kvIndex, src: t.order[replica]}
}

// kvAwareExtras prepares kv-aware for the sim: a mock replica in-process
// answers /tokenize (the policy tokenizes chat prompts remotely, and the
// sim's replicas have no HTTP side), and the block size is given up front
// instead of learnt from the first event. User-given params win.
func kvAwareExtras(spec PolicySpec, o SimOptions, log *zerolog.Logger) (extra string, closeFn func() error, err error) {
	has := map[string]bool{}
	for _, p := range spec.Params {
		has[p.Key] = true
	}
	var parts []string
	if !has["block_size"] {
		parts = append(parts, "block_size: "+strconv.Itoa(o.BlockSize))
	}
	closeFn = func() error { return nil }
	if !has["tokenizer"] {
		cfg := mock.DefaultConfig()
		cfg.Name = "bench-tokenizer"
		cfg.Models = []string{o.Model}
		cfg.BlockSize = o.BlockSize
		cfg.TimeScale = 0
		cfg.RequestLogSize = -1
		srv, err := mock.New(cfg, log)
		if err != nil {
			return "", nil, fmt.Errorf("kv-aware tokenizer: %w", err)
		}
		url, err := srv.Start("127.0.0.1:0")
		if err != nil {
			return "", nil, fmt.Errorf("kv-aware tokenizer: %w", err)
		}
		// A generous timeout: the sim measures routing quality, and a
		// tokenizer timeout on a busy 2-core box would silently fall back.
		parts = append(parts, fmt.Sprintf("tokenizer: {address: %q, timeout: 5s}", strings.TrimPrefix(url, "http://")))
		closeFn = srv.Close
	}
	return strings.Join(parts, ", "), closeFn, nil
}

// attachKVIndex finds the kv-aware policy's index after the server is built.
func (t *turnoutRouter) attachKVIndex() error {
	pools := t.srv.Snapshot().Pools()
	if len(pools) != 1 {
		return fmt.Errorf("kv-aware: %d pools, want 1", len(pools))
	}
	k, ok := pools[0].Policy.(*policy.KVAware)
	if !ok {
		return fmt.Errorf("kv-aware: pool policy is %T", pools[0].Policy)
	}
	t.kvIndex = k.Index()
	return nil
}
