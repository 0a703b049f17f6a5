package kv

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/kvtopic"
)

// Bind mode. vLLM's ZMQ publisher binds only when its endpoint is a
// wildcard (tcp://*:5557); given a concrete address it connects, which is
// how llm-d deploys engines: every engine's PUB connects to one indexer that
// binds a SUB. turnout does the same with a Binder: one bound SUB socket,
// messages attributed to endpoints by topic (vLLM's "kv@<host>:<port>@<model>"
// convention, see kvtopic.Pattern). Each endpoint still gets its own Subscriber
// state, so sequence gaps and restarts are judged per publisher.

// Hub owns the bound SUB sockets of a process, so several pools (or
// deployments) can share one bind address. The zero value is not usable;
// use NewHub.
type Hub struct {
	ctx context.Context
	log zerolog.Logger

	mu     sync.Mutex
	bound  map[string]*Binder
	closed bool
}

// NewHub returns a hub whose sockets live until ctx ends or Close.
func NewHub(ctx context.Context, log *zerolog.Logger) *Hub {
	return &Hub{ctx: ctx, log: loggerOrNop(log).With().Str("component", "kv-bind").Logger(), bound: map[string]*Binder{}}
}

// acquire returns the binder of addr, binding it on first use.
func (h *Hub) acquire(addr string) (*Binder, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, errors.New("kv: hub closed")
	}
	if b := h.bound[addr]; b != nil {
		b.refs++
		return b, nil
	}
	b, err := newBinder(h.ctx, addr, &h.log)
	if err != nil {
		return nil, err
	}
	b.refs = 1
	h.bound[addr] = b
	return b, nil
}

// release drops a reference; the last one closes the socket.
func (h *Hub) release(b *Binder) {
	h.mu.Lock()
	b.refs--
	last := b.refs == 0
	if last {
		delete(h.bound, b.addr)
	}
	h.mu.Unlock()
	if last {
		b.close()
	}
}

// Stats returns each bound address's counters.
func (h *Hub) Stats() map[string]BinderStats {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]BinderStats, len(h.bound))
	for a, b := range h.bound {
		out[a] = b.Stats()
	}
	return out
}

// Close unbinds every socket.
func (h *Hub) Close() {
	h.mu.Lock()
	h.closed = true
	bs := slices.Collect(maps.Values(h.bound))
	clear(h.bound)
	h.mu.Unlock()
	for _, b := range bs {
		b.close()
	}
}

// BinderStats are a bound socket's counters.
type BinderStats struct {
	Messages      uint64 // messages received
	UnknownTopics uint64 // messages whose topic matched no endpoint (dropped)
}

// Binder is one bound SUB socket; it hands each message to the Subscriber
// whose topic pattern matches it.
type Binder struct {
	addr   string
	sock   zmq4.Socket
	cancel context.CancelFunc
	done   chan struct{}
	log    zerolog.Logger
	refs   int // guarded by Hub.mu

	mu     sync.RWMutex
	routes []binderRoute

	messages, unknown atomic.Uint64
}

type binderRoute struct {
	pat kvtopic.Pattern
	sub *Subscriber
}

func newBinder(ctx context.Context, addr string, log *zerolog.Logger) (*Binder, error) {
	ctx, cancel := context.WithCancel(ctx)
	b := &Binder{addr: addr, cancel: cancel, done: make(chan struct{}),
		log: log.With().Str("bind", addr).Logger()}
	b.sock = zmq4.NewSub(ctx, zmq4.WithLogger(zmqLogger(&b.log)))
	// Everything: attribution is by topic, and unknown topics are counted.
	if err := b.sock.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		cancel()
		_ = b.sock.Close()
		return nil, fmt.Errorf("kv: bind %s: subscribe: %w", addr, err)
	}
	if err := b.sock.Listen(addr); err != nil {
		cancel()
		_ = b.sock.Close()
		return nil, fmt.Errorf("kv: bind %s: %w", addr, err)
	}
	go b.run(ctx)
	b.log.Info().Msg("kv events: SUB bound, waiting for publishers to connect")
	return b, nil
}

// Addr is the bound endpoint with the actual port (for tcp://host:0).
func (b *Binder) Addr() string { return endpointOf(b.addr, b.sock) }

func (b *Binder) attach(p kvtopic.Pattern, s *Subscriber) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.routes = append(b.routes, binderRoute{p, s})
}

func (b *Binder) detach(s *Subscriber) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, r := range b.routes {
		if r.sub == s {
			b.routes = append(b.routes[:i], b.routes[i+1:]...)
			return
		}
	}
}

// lookup returns the most specific matching subscriber, or nil.
func (b *Binder) lookup(topic []byte) *Subscriber {
	b.mu.RLock()
	defer b.mu.RUnlock()
	var best *Subscriber
	w := -1
	for _, r := range b.routes {
		if r.pat.Match(topic) && r.pat.Weight() > w {
			best, w = r.sub, r.pat.Weight()
		}
	}
	return best
}

// run is the only caller of the attached Subscribers' handle, so their
// sequence state has a single owner, as in dial mode.
func (b *Binder) run(ctx context.Context) {
	defer close(b.done)
	for {
		msg, err := b.sock.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// zmq4 reports each publisher's disconnect as a receive
			// error; the socket itself carries on with the others.
			b.log.Debug().Err(err).Msg("kv events: a publisher disconnected")
			continue
		}
		b.messages.Add(1)
		var topic []byte
		if len(msg.Frames) == 3 {
			topic = msg.Frames[0]
		}
		s := b.lookup(topic)
		if s == nil {
			n := b.unknown.Add(1)
			if bits.OnesCount64(n) == 1 { // 1st, 2nd, 4th...
				b.log.Warn().Str("topic", string(topic)).Uint64("unknown_total", n).
					Msg("kv events: topic matches no endpoint; dropped")
			}
			continue
		}
		s.connected.Store(true)
		s.handle(ctx, msg.Frames)
	}
}

// Stats returns the counters.
func (b *Binder) Stats() BinderStats {
	return BinderStats{Messages: b.messages.Load(), UnknownTopics: b.unknown.Load()}
}

func (b *Binder) close() {
	b.cancel()
	_ = b.sock.Close()
	select {
	case <-b.done:
	case <-time.After(5 * time.Second):
		b.log.Warn().Msg("kv events: bound socket slow to stop")
	}
	b.log.Info().Msg("kv events: SUB unbound")
}

// hold takes an extra reference so a Sync that stops and restarts the
// same bind address does not unbind it in between.
func (h *Hub) hold(b *Binder) {
	h.mu.Lock()
	b.refs++
	h.mu.Unlock()
}
