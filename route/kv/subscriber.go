package kv

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/rs/zerolog"
)

// SubscriberConfig configures a Subscriber for one replica's publisher.
type SubscriberConfig struct {
	// Name identifies the source in callbacks (the replica name).
	Name string
	// Address is the replica's PUB endpoint, e.g. "tcp://10.0.0.5:5557".
	Address string
	// Topic is the subscription prefix ("" for all).
	Topic string
	// ReplayAddress, if set, is the replica's replay ROUTER endpoint, used
	// best effort to fill sequence gaps.
	ReplayAddress string

	MinBackoff    time.Duration // first reconnect delay (default 100ms)
	MaxBackoff    time.Duration // reconnect delay cap (default 10s)
	DialTimeout   time.Duration // TCP connect + ZMTP handshake (default 3s)
	ReplayTimeout time.Duration // whole replay exchange (default 2s)
	// MaxReplay bounds how many missed batches a replay may fetch
	// (default 10000, vLLM's replay buffer size).
	MaxReplay int

	// OnBatch receives every decoded batch in sequence order. Required.
	// The batch's events and their slices are reused once it returns.
	OnBatch func(src string, b Batch)
	// OnGap is called when src's events were lost: a sequence gap replay
	// could not fill, or a payload that failed to decode.
	OnGap func(src string)
	// OnRestart is called when src's sequence went backwards (the replica
	// restarted); it precedes the OnBatch of the message that showed it.
	OnRestart func(src string)
}

// SubscriberStats are a subscriber's counters.
type SubscriberStats struct {
	Messages     uint64 // ZMQ messages received
	Events       uint64 // events delivered to OnBatch
	Malformed    uint64 // messages or payloads that could not be decoded
	Gaps         uint64 // sequence gaps seen (filled by replay or not)
	Restarts     uint64 // sequence went backwards
	Reconnects   uint64 // connection attempts after the first
	DialFailures uint64
	Replayed     uint64 // batches recovered through replay
	// Rejected counts single events dropped from good batches, by reason.
	Rejected  [NumRejectReasons]uint64
	Connected bool
	HaveSeq   bool
	LastSeq   uint64
}

// Subscriber follows one replica's KV-event stream: it reconnects with
// capped exponential backoff, checks sequence numbers and decodes payloads.
type Subscriber struct {
	cfg SubscriberConfig
	log zerolog.Logger

	// Sequence state and the decoder's memory, owned by the goroutine
	// that calls handle (Run's, or a Binder's).
	last    uint64
	haveSeq bool
	dec     Decoder

	messages, events, malformed, gaps, restarts, reconnects, dialFailures, replayed atomic.Uint64
	rejected                                                                        [NumRejectReasons]atomic.Uint64
	connected, statHave                                                             atomic.Bool
	statLast                                                                        atomic.Uint64
}

// NewSubscriber validates cfg and applies defaults.
func NewSubscriber(cfg SubscriberConfig, log *zerolog.Logger) (*Subscriber, error) {
	if cfg.Address == "" {
		return nil, errors.New("kv: subscriber needs an address")
	}
	if cfg.OnBatch == nil {
		return nil, errors.New("kv: subscriber needs OnBatch")
	}
	if cfg.Name == "" {
		cfg.Name = cfg.Address
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 100 * time.Millisecond
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(10*time.Second, cfg.MinBackoff)
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 3 * time.Second
	}
	if cfg.ReplayTimeout <= 0 {
		cfg.ReplayTimeout = 2 * time.Second
	}
	if cfg.MaxReplay <= 0 {
		cfg.MaxReplay = 10000
	}
	return &Subscriber{
		cfg: cfg,
		log: loggerOrNop(log).With().Str("component", "kv-subscriber").Str("source", cfg.Name).Str("addr", cfg.Address).Logger(),
	}, nil
}

// Stats returns a snapshot of the counters.
func (s *Subscriber) Stats() SubscriberStats {
	var rej [NumRejectReasons]uint64
	for i := range rej {
		rej[i] = s.rejected[i].Load()
	}
	return SubscriberStats{
		Rejected:     rej,
		Messages:     s.messages.Load(),
		Events:       s.events.Load(),
		Malformed:    s.malformed.Load(),
		Gaps:         s.gaps.Load(),
		Restarts:     s.restarts.Load(),
		Reconnects:   s.reconnects.Load(),
		DialFailures: s.dialFailures.Load(),
		Replayed:     s.replayed.Load(),
		Connected:    s.connected.Load(),
		HaveSeq:      s.statHave.Load(),
		LastSeq:      s.statLast.Load(),
	}
}

// Run receives until ctx is cancelled, then returns nil. Run must not be
// called concurrently on the same Subscriber.
func (s *Subscriber) Run(ctx context.Context) error {
	backoff := s.cfg.MinBackoff
	for attempt := 0; ; attempt++ {
		if ctx.Err() != nil {
			return nil
		}
		if attempt > 0 {
			s.reconnects.Add(1)
		}
		progressed, err := s.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if progressed {
			backoff = s.cfg.MinBackoff
		}
		s.log.Warn().Err(err).Dur("retry_in", backoff).Msg("kv event stream down")
		// Jitter keeps a fleet of subscribers from reconnecting in step.
		wait := backoff/2 + rand.N(backoff/2+1)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		backoff = min(2*backoff, s.cfg.MaxBackoff)
	}
}

// socketOptions are the options of the replay's socket: dial retries are
// ours (with backoff), not zmq4's fixed-interval ones.
func (s *Subscriber) socketOptions() []zmq4.Option {
	return []zmq4.Option{
		zmq4.WithDialerMaxRetries(0),
		zmq4.WithDialerTimeout(s.cfg.DialTimeout),
		zmq4.WithLogger(zmqLogger(&s.log)),
	}
}

// session runs one connection; progressed reports whether any message
// arrived, which resets the backoff.
func (s *Subscriber) session(ctx context.Context) (progressed bool, err error) {
	conn, err := dialSub(ctx, s.cfg.Address, s.cfg.Topic, s.cfg.DialTimeout)
	if err != nil {
		s.dialFailures.Add(1)
		return false, fmt.Errorf("dial %s: %w", s.cfg.Address, err)
	}
	defer conn.close()
	s.connected.Store(true)
	defer s.connected.Store(false)
	s.log.Info().Msg("kv event stream connected")
	for {
		frames, err := conn.recv()
		if err != nil {
			return progressed, fmt.Errorf("recv: %w", err)
		}
		progressed = true
		s.handle(ctx, frames)
	}
}

// dialGuarded bounds Dial: zmq4's ZMTP handshake has no deadline, so a peer
// that accepts TCP but never speaks would otherwise hang us forever.
func dialGuarded(ctx context.Context, sock zmq4.Socket, addr string, timeout time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- sock.Dial(addr) }()
	t := time.NewTimer(2 * timeout)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return errors.New("connect/handshake timeout")
	case <-ctx.Done():
		// Give the dial a moment to notice, so the caller's Close does
		// not race with it.
		select {
		case <-done:
		case <-time.After(time.Second):
		}
		return ctx.Err()
	}
}

func (s *Subscriber) handle(ctx context.Context, frames [][]byte) {
	s.messages.Add(1)
	var seqb, payload []byte
	switch len(frames) {
	case 3: // vLLM: topic, seq, payload
		seqb, payload = frames[1], frames[2]
	case 2: // tolerate a publisher that sends no topic frame
		seqb, payload = frames[0], frames[1]
	}
	if len(seqb) != 8 {
		// Without a sequence number we cannot place it; losing its events
		// is a gap in all but name.
		s.badMessage(fmt.Errorf("%w: %d frames, seq frame of %d bytes", ErrMalformed, len(frames), len(seqb)))
		return
	}
	seq := binary.BigEndian.Uint64(seqb)
	b, decErr := s.dec.Decode(payload)
	switch classifySeq(s.haveSeq, s.last, seq) {
	case seqRestart:
		s.restarts.Add(1)
		s.log.Info().Uint64("seq", seq).Uint64("last", s.last).Msg("kv event sequence went back: replica restarted")
		if s.cfg.OnRestart != nil {
			s.cfg.OnRestart(s.cfg.Name)
		}
	case seqGap:
		s.gaps.Add(1)
		s.log.Warn().Uint64("seq", seq).Uint64("last", s.last).Msg("kv event sequence gap")
		if !s.replay(ctx, s.last+1, seq) && s.cfg.OnGap != nil {
			s.cfg.OnGap(s.cfg.Name)
		}
	}
	s.last, s.haveSeq = seq, true
	s.statLast.Store(seq)
	s.statHave.Store(true)
	if decErr != nil {
		s.badMessage(decErr)
		return
	}
	s.deliver(b)
}

type seqVerdict uint8

const (
	seqNext    seqVerdict = iota // first message, or last+1
	seqGap                       // messages were skipped
	seqRestart                   // not past last: the publisher started over
)

// classifySeq judges seq against the previous one. A repeat of last counts
// as a restart too: vLLM never resends on PUB, so only a new publisher
// numbering from 0 again can produce it.
func classifySeq(have bool, last, seq uint64) seqVerdict {
	switch {
	case !have || seq == last+1:
		return seqNext
	case seq <= last:
		return seqRestart
	}
	return seqGap
}

func (s *Subscriber) deliver(b Batch) {
	if b.RejectErr != nil {
		var total uint64
		for r, n := range b.Rejected {
			if n > 0 {
				total = s.rejected[r].Add(uint64(n))
			}
		}
		if bits.OnesCount64(total) == 1 { // sparse logging, as for malformed
			s.log.Warn().Err(b.RejectErr).Int("rejected", b.Rejects()).Int("applied", len(b.Events)).
				Msg("kv events rejected; the rest of the batch applies")
		}
	}
	s.events.Add(uint64(len(b.Events)))
	s.cfg.OnBatch(s.cfg.Name, b)
}

func (s *Subscriber) badMessage(err error) {
	n := s.malformed.Add(1)
	if bits.OnesCount64(n) == 1 { // log the 1st, 2nd, 4th, 8th... only
		s.log.Warn().Err(err).Uint64("malformed_total", n).Msg("dropping malformed kv event message")
	}
	if s.cfg.OnGap != nil {
		s.cfg.OnGap(s.cfg.Name)
	}
}

// replay fetches batches [from, to) from the replica's replay socket and
// delivers them; it reports whether the whole range was recovered.
func (s *Subscriber) replay(ctx context.Context, from, to uint64) bool {
	if s.cfg.ReplayAddress == "" || to-from > uint64(s.cfg.MaxReplay) {
		return false
	}
	got, err := s.fetchReplay(ctx, from, to)
	if err != nil {
		s.log.Warn().Err(err).Uint64("from", from).Uint64("to", to).Msg("kv event replay failed")
		return false
	}
	for _, b := range got {
		s.deliver(b)
	}
	s.replayed.Add(uint64(len(got)))
	return true
}

func (s *Subscriber) fetchReplay(ctx context.Context, from, to uint64) ([]Batch, error) {
	rctx, cancel := context.WithTimeout(ctx, s.cfg.ReplayTimeout)
	defer cancel()
	d := zmq4.NewDealer(rctx, s.socketOptions()...)
	defer d.Close()
	if err := dialGuarded(rctx, d, s.cfg.ReplayAddress, s.cfg.DialTimeout); err != nil {
		return nil, fmt.Errorf("dial replay: %w", err)
	}
	start := make([]byte, 8)
	binary.BigEndian.PutUint64(start, from)
	// The empty delimiter makes us look like a REQ client, which is what
	// vLLM's ROUTER expects: [identity, "", start].
	if err := d.SendMulti(zmq4.NewMsgFrom([]byte{}, start)); err != nil {
		return nil, fmt.Errorf("send replay request: %w", err)
	}
	out := make([]Batch, 0, to-from)
	want := from
	for want < to {
		msg, err := d.Recv()
		if err != nil {
			return nil, fmt.Errorf("recv replay: %w", err)
		}
		f := msg.Frames
		if len(f) == 3 && len(f[0]) == 0 {
			f = f[1:]
		}
		if len(f) != 2 || len(f[0]) != 8 {
			return nil, fmt.Errorf("%w: replay reply of %d frames", ErrMalformed, len(msg.Frames))
		}
		seq := binary.BigEndian.Uint64(f[0])
		switch {
		case seq == endSeq:
			return nil, fmt.Errorf("replay ended at %d, wanted up to %d", want, to-1)
		case seq < want:
			continue
		case seq > want:
			return nil, fmt.Errorf("replay skipped from %d to %d", want, seq)
		}
		b, err := DecodeBatch(f[1])
		if err != nil {
			s.malformed.Add(1)
			return nil, fmt.Errorf("replayed batch %d: %w", seq, err)
		}
		out = append(out, b)
		want++
	}
	// The rest of the stream (up to the end marker) is dropped with the
	// socket; those batches also arrive on the PUB stream.
	return out, nil
}
