package bench

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/route/kv"
)

// Mock KV-event publishers for the ingest axis of the scale bench
// (`turnout-lab bench kvpub`, started by `bench scale --kv` as a process
// of its own so the ingesting process's CPU is the subscriber's and the
// index's alone): N vLLM-like PUB sockets on loopback sending msgpack
// EventBatches through kv.Publisher, the encoder lab/mock's replicas
// publish with.

// KVPubOptions shape the publishers' stream.
type KVPubOptions struct {
	Publishers int
	// Rate is the events per second of all publishers together.
	Rate int
	// EventsPerBatch is how many events one EventBatch (one ZMQ message,
	// one engine step) carries.
	EventsPerBatch int
	// BlocksPerEvent is the blocks one BlockStored or BlockRemoved names.
	BlocksPerEvent int
	// BlockSize is the tokens per block (vLLM's default 16).
	BlockSize int
	// Held is the blocks each publisher keeps cached: past it, its oldest
	// are removed (BlockRemoved) as new ones are stored.
	Held int
	// ChainEvents is how many stored events extend one prefix chain (each
	// names the previous one's last block as parent) before a new chain.
	ChainEvents int
}

// DefaultKVPubOptions is the stream of docs/scale.md's KV rows.
func DefaultKVPubOptions() KVPubOptions {
	return KVPubOptions{Publishers: 64, Rate: 200000, EventsPerBatch: 16, BlocksPerEvent: 4, BlockSize: 16, Held: 1 << 20 / 64, ChainEvents: 8}
}

func (o KVPubOptions) check() error {
	if o.Publishers <= 0 || o.Rate <= 0 || o.EventsPerBatch <= 0 || o.BlocksPerEvent <= 0 || o.BlockSize <= 0 || o.Held <= 0 || o.ChainEvents <= 0 {
		return fmt.Errorf("kv publishers: publishers, rate, events per batch, blocks per event, block size, held blocks and chain events must be positive (got %+v)", o)
	}
	return nil
}

// interval is how often one publisher sends a batch for the total rate.
func (o KVPubOptions) interval() time.Duration {
	return time.Duration(float64(time.Second) * float64(o.Publishers*o.EventsPerBatch) / float64(o.Rate))
}

// kvStream generates one publisher's events: chains of stored blocks with
// unique hashes, and removals of its oldest blocks once it holds o.Held.
type kvStream struct {
	o       KVPubOptions
	id      uint64
	next    uint64   // next block number (hash = id<<40 | next)
	held    []uint64 // FIFO of held hashes
	head    int      // held[head:] are held
	chainAt int      // stored events in the current chain
	parent  uint64
	evs     []kv.Event
	tokens  []uint32
}

func newKVStream(o KVPubOptions, id int) *kvStream {
	return &kvStream{o: o, id: uint64(id) + 1, next: 1}
}

// batch returns the next EventBatch's events (valid until the next call).
func (s *kvStream) batch() []kv.Event {
	s.evs = s.evs[:0]
	s.tokens = s.tokens[:0]
	b := s.o.BlocksPerEvent
	for range s.o.EventsPerBatch {
		if len(s.held)-s.head >= s.o.Held {
			hs := append([]uint64(nil), s.held[s.head:s.head+b]...)
			s.head += b
			s.evs = append(s.evs, kv.Event{Kind: kv.EventBlockRemoved, BlockHashes: hs, Medium: kv.MediumGPU})
			continue
		}
		if s.head > len(s.held)/2 { // compact the FIFO
			s.held = append(s.held[:0], s.held[s.head:]...)
			s.head = 0
		}
		hs := make([]uint64, b)
		start := len(s.tokens)
		for j := range hs {
			hs[j] = s.id<<40 | s.next
			for t := range s.o.BlockSize {
				s.tokens = append(s.tokens, uint32((s.next*31+uint64(t))%50000))
			}
			s.next++
		}
		ev := kv.Event{Kind: kv.EventBlockStored, BlockHashes: hs, ParentHash: s.parent, HasParent: s.chainAt > 0,
			TokenIDs: s.tokens[start:], BlockSize: s.o.BlockSize, Medium: kv.MediumGPU}
		s.evs = append(s.evs, ev)
		s.held = append(s.held, hs...)
		s.parent = hs[len(hs)-1]
		if s.chainAt++; s.chainAt == s.o.ChainEvents {
			s.chainAt = 0
		}
	}
	return s.evs
}

// KVPublishers are the running publishers.
type KVPublishers struct {
	o    KVPubOptions
	pubs []*kv.Publisher
}

// StartKVPublishers binds o.Publishers PUB sockets on loopback (ephemeral
// ports); Run sends.
func StartKVPublishers(ctx context.Context, o KVPubOptions, log *zerolog.Logger) (*KVPublishers, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	k := &KVPublishers{o: o}
	for i := range o.Publishers {
		p, err := kv.NewPublisherWithConfig(ctx, kv.PublisherConfig{Addr: "tcp://127.0.0.1:0", Topic: fmt.Sprintf("kv@r%d@llama", i)}, log)
		if err != nil {
			k.Close()
			return nil, fmt.Errorf("kv publisher %d: %w", i, err)
		}
		k.pubs = append(k.pubs, p)
	}
	return k, nil
}

// WriteAddrs writes one publisher address a line.
func (k *KVPublishers) WriteAddrs(w io.Writer) error {
	for _, p := range k.pubs {
		if _, err := fmt.Fprintln(w, p.Addr()); err != nil {
			return fmt.Errorf("kv publishers: %w", err)
		}
	}
	return nil
}

// Run publishes at the options' rate until ctx ends.
func (k *KVPublishers) Run(ctx context.Context) {
	done := make(chan struct{})
	iv := k.o.interval()
	for i, p := range k.pubs {
		go func() {
			defer func() { done <- struct{}{} }()
			s := newKVStream(k.o, i)
			// Spread the publishers' sends over one interval.
			t := time.NewTimer(iv * time.Duration(i) / time.Duration(len(k.pubs)))
			defer t.Stop()
			next := time.Now()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				p.Publish(s.batch())
				next = next.Add(iv)
				t.Reset(max(0, time.Until(next)))
			}
		}()
	}
	for range k.pubs {
		<-done
	}
}

// Stats sums the publishers' counters.
func (k *KVPublishers) Stats() kv.PublisherStats {
	var st kv.PublisherStats
	for _, p := range k.pubs {
		s := p.Stats()
		st.Sent += s.Sent
		st.Dropped += s.Dropped
		st.EncodeErrors += s.EncodeErrors
	}
	return st
}

// Close closes every publisher.
func (k *KVPublishers) Close() {
	for _, p := range k.pubs {
		_ = p.Close()
	}
}
