package kv

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	stdlog "log"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/rs/zerolog"
)

// endSeq terminates a replay stream: vLLM sends (-1).to_bytes(8, "big", signed=True).
const endSeq = ^uint64(0)

// PublisherConfig configures a vLLM-compatible KV-event publisher.
type PublisherConfig struct {
	// Addr is the PUB endpoint to bind, e.g. "tcp://*:5557" or
	// "tcp://127.0.0.1:0" for an ephemeral port (see Publisher.Addr).
	Addr string
	// Connect, instead of Addr, makes the PUB connect to a subscriber that
	// binds (vLLM with a concrete endpoint, llm-d): it keeps redialing
	// until connected and after the connection drops.
	Connect string
	Topic   string
	// ReplayAddr, if set, binds a ROUTER serving vLLM's replay protocol.
	ReplayAddr string
	// QueueSize bounds batches waiting to be sent; beyond it calls drop.
	QueueSize int
	// ReplayBuffer is how many past batches replay can serve (vLLM: 10000).
	ReplayBuffer int
	// DPRank is sent as data_parallel_rank, as current vLLM always does.
	DPRank int
	// Encoding selects the wire layout (legacy arrays by default).
	Encoding EncodeOptions
}

// PublisherStats are the publisher's counters.
type PublisherStats struct {
	Sent, Dropped, EncodeErrors, ReplayRequests uint64
}

// Publisher emits KV events the way a vLLM replica does. Its event methods
// never block: batches go through a bounded queue and are dropped (and
// counted) when it is full.
type Publisher struct {
	cfg    PublisherConfig
	log    zerolog.Logger
	pub    zmq4.Socket
	router zmq4.Socket
	addr   string
	raddr  string
	ch     chan []byte
	cancel context.CancelFunc
	wg     sync.WaitGroup
	closed atomic.Bool

	mu     sync.Mutex // guards replay
	replay []replayed
	rnext  int // ring position once replay is full

	sent, dropped, encodeErrs, replays atomic.Uint64
}

type replayed struct {
	seq     uint64
	payload []byte
}

// NewPublisher binds a PUB socket at addr publishing under topic.
func NewPublisher(ctx context.Context, addr, topic string, log *zerolog.Logger) (*Publisher, error) {
	return NewPublisherWithConfig(ctx, PublisherConfig{Addr: addr, Topic: topic}, log)
}

// NewPublisherWithConfig binds the sockets described by cfg.
func NewPublisherWithConfig(ctx context.Context, cfg PublisherConfig, log *zerolog.Logger) (*Publisher, error) {
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = 1024
	}
	if cfg.ReplayBuffer <= 0 {
		cfg.ReplayBuffer = 10000
	}
	ctx, cancel := context.WithCancel(ctx)
	p := &Publisher{
		cfg:    cfg,
		log:    loggerOrNop(log).With().Str("component", "kv-publisher").Logger(),
		ch:     make(chan []byte, cfg.QueueSize),
		cancel: cancel,
	}
	// Redials are ours (keepConnected), not zmq4's fixed-interval retries.
	p.pub = zmq4.NewPub(ctx, zmq4.WithLogger(zmqLogger(&p.log)),
		zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(time.Second))
	// zmq4 queues without bound unless HWM is set; a stuck subscriber
	// must not grow our memory.
	if err := p.pub.SetOption(zmq4.OptionHWM, 10000); err != nil {
		p.closeSockets()
		cancel()
		return nil, fmt.Errorf("kv: publisher hwm: %w", err)
	}
	switch {
	case (cfg.Addr == "") == (cfg.Connect == ""):
		p.closeSockets()
		cancel()
		return nil, errors.New("kv: publisher needs one of Addr (bind) or Connect")
	case cfg.Connect != "":
		p.addr = cfg.Connect
		p.wg.Add(1)
		go p.keepConnected(ctx)
	default:
		if err := p.pub.Listen(cfg.Addr); err != nil {
			p.closeSockets()
			cancel()
			return nil, fmt.Errorf("kv: publisher listen %q: %w", cfg.Addr, err)
		}
		p.addr = endpointOf(cfg.Addr, p.pub)
	}
	if cfg.ReplayAddr != "" {
		p.router = zmq4.NewRouter(ctx, zmq4.WithLogger(zmqLogger(&p.log)), zmq4.WithTimeout(2*time.Second))
		if err := p.router.Listen(cfg.ReplayAddr); err != nil {
			p.closeSockets()
			cancel()
			return nil, fmt.Errorf("kv: replay listen %q: %w", cfg.ReplayAddr, err)
		}
		p.raddr = endpointOf(cfg.ReplayAddr, p.router)
		p.wg.Add(1)
		go p.serveReplay(ctx)
	}
	p.wg.Add(1)
	go p.run(ctx)
	return p, nil
}

// keepConnected dials cfg.Connect until a subscription arrives over it, and
// again once the subscriptions vanish (the subscriber went away): zmq4,
// unlike libzmq, does not reconnect by itself. A live connection always
// carries a subscription (the binder subscribes to everything on accept).
func (p *Publisher) keepConnected(ctx context.Context) {
	defer p.wg.Done()
	const poll = 200 * time.Millisecond
	for {
		if !p.subscribed() {
			dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			err := dialGuarded(dctx, p.pub, p.cfg.Connect, time.Second)
			cancel()
			if err != nil {
				p.log.Debug().Err(err).Str("connect", p.cfg.Connect).Msg("kv publisher connect")
			}
			// Once connected, give the subscription time to arrive
			// before judging again.
			for i := 0; err == nil && i < 10 && !p.subscribed(); i++ {
				select {
				case <-ctx.Done():
					return
				case <-time.After(poll):
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(poll):
		}
	}
}

// endpointOf turns a bound socket's listener address into a dialable
// endpoint, resolving port 0.
func endpointOf(requested string, s zmq4.Socket) string {
	if a := s.Addr(); a != nil && a.Network() == "tcp" {
		return "tcp://" + a.String()
	}
	return requested
}

// Addr is the bound PUB endpoint (with the actual port).
func (p *Publisher) Addr() string { return p.addr }

// ReplayAddr is the bound replay endpoint, or "".
func (p *Publisher) ReplayAddr() string { return p.raddr }

// BlocksStored publishes one BlockStored event.
func (p *Publisher) BlocksStored(blockHashes []uint64, parentHash uint64, hasParent bool, tokenIDs []uint32, blockSize int) {
	p.Publish([]Event{{
		Kind:        EventBlockStored,
		BlockHashes: blockHashes,
		ParentHash:  parentHash,
		HasParent:   hasParent,
		TokenIDs:    tokenIDs,
		BlockSize:   blockSize,
		Medium:      MediumGPU,
	}})
}

// BlocksRemoved publishes one BlockRemoved event.
func (p *Publisher) BlocksRemoved(blockHashes []uint64) {
	p.Publish([]Event{{Kind: EventBlockRemoved, BlockHashes: blockHashes, Medium: MediumGPU}})
}

// AllBlocksCleared publishes one AllBlocksCleared event.
func (p *Publisher) AllBlocksCleared() {
	p.Publish([]Event{{Kind: EventAllBlocksCleared}})
}

// Publish sends events as one EventBatch. It encodes before returning, so
// the caller may reuse its slices; it reports false if the batch was dropped.
func (p *Publisher) Publish(events []Event) bool {
	if p.closed.Load() {
		p.dropped.Add(1)
		return false
	}
	b := Batch{
		TS:        float64(time.Now().UnixNano()) / 1e9,
		Events:    events,
		DPRank:    p.cfg.DPRank,
		HasDPRank: true,
	}
	payload, err := EncodeBatchWith(b, p.cfg.Encoding)
	if err != nil {
		p.encodeErrs.Add(1)
		p.log.Error().Err(err).Msg("encode kv event batch")
		return false
	}
	select {
	case p.ch <- payload:
		return true
	default:
		p.dropped.Add(1)
		return false
	}
}

// run assigns sequence numbers at send time, so drops on the queue do not
// show up as gaps to subscribers.
func (p *Publisher) run(ctx context.Context) {
	defer p.wg.Done()
	var seq uint64
	topic := []byte(p.cfg.Topic)
	for {
		select {
		case <-ctx.Done():
			return
		case payload := <-p.ch:
			sb := make([]byte, 8)
			binary.BigEndian.PutUint64(sb, seq)
			if err := p.pub.SendMulti(zmq4.NewMsgFrom(topic, sb, payload)); err != nil {
				p.log.Warn().Err(err).Uint64("seq", seq).Msg("send kv event batch")
			} else {
				p.sent.Add(1)
			}
			p.remember(seq, payload)
			seq++
		}
	}
}

func (p *Publisher) remember(seq uint64, payload []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.replay) < p.cfg.ReplayBuffer {
		p.replay = append(p.replay, replayed{seq, payload})
		return
	}
	p.replay[p.rnext] = replayed{seq, payload}
	p.rnext = (p.rnext + 1) % len(p.replay)
}

// since returns buffered batches with seq >= start, oldest first.
func (p *Publisher) since(start uint64) []replayed {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []replayed
	for i := range p.replay {
		r := p.replay[(p.rnext+i)%len(p.replay)]
		if r.seq >= start {
			out = append(out, r)
		}
	}
	return out
}

// serveReplay answers like vLLM's ZmqEventPublisher._service_replay: a
// request [identity, "", start] gets [identity, "", seq, payload] per
// buffered batch and a final [identity, "", -1, ""].
func (p *Publisher) serveReplay(ctx context.Context) {
	defer p.wg.Done()
	for {
		msg, err := p.router.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// A peer went away; keep serving others, without spinning.
			select {
			case <-ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		f := msg.Frames
		if len(f) < 2 || len(f[len(f)-1]) != 8 {
			p.log.Warn().Int("frames", len(f)).Msg("invalid replay request")
			continue
		}
		p.replays.Add(1)
		id, start := f[0], binary.BigEndian.Uint64(f[len(f)-1])
		for _, r := range p.since(start) {
			sb := make([]byte, 8)
			binary.BigEndian.PutUint64(sb, r.seq)
			if err := p.router.SendMulti(zmq4.NewMsgFrom(id, nil, sb, r.payload)); err != nil {
				break
			}
		}
		eb := make([]byte, 8)
		binary.BigEndian.PutUint64(eb, endSeq)
		_ = p.router.SendMulti(zmq4.NewMsgFrom(id, nil, eb, nil))
	}
}

// Stats returns the publisher's counters.
func (p *Publisher) Stats() PublisherStats {
	return PublisherStats{
		Sent:           p.sent.Load(),
		Dropped:        p.dropped.Load(),
		EncodeErrors:   p.encodeErrs.Load(),
		ReplayRequests: p.replays.Load(),
	}
}

// subscribed reports whether any subscriber's subscription has reached the
// PUB socket; tests use it to get past ZMQ's slow-joiner window.
func (p *Publisher) subscribed() bool {
	t, ok := p.pub.(zmq4.Topics)
	return ok && len(t.Topics()) > 0
}

// Close stops the publisher; queued batches not yet sent are dropped.
func (p *Publisher) Close() error {
	if !p.closed.CompareAndSwap(false, true) {
		return nil
	}
	p.cancel()
	err := p.closeSockets()
	p.wg.Wait()
	return err
}

func (p *Publisher) closeSockets() error {
	var errs []error
	if p.pub != nil {
		errs = append(errs, p.pub.Close())
	}
	if p.router != nil {
		errs = append(errs, p.router.Close())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("kv: close publisher: %w", err)
	}
	return nil
}

func loggerOrNop(l *zerolog.Logger) *zerolog.Logger {
	if l == nil {
		nop := zerolog.Nop()
		return &nop
	}
	return l
}

// zmqLogger adapts zerolog for zmq4, which wants a *log.Logger.
func zmqLogger(l *zerolog.Logger) *stdlog.Logger {
	return stdlog.New(l.With().Str("lib", "zmq4").Logger(), "", 0)
}
