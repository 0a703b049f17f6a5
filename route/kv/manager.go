package kv

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/kvtopic"
)

// Endpoint is one replica's KV-event publisher, either dialed (Address) or
// connecting to a socket turnout binds (Bind, attributed by Pattern).
type Endpoint struct {
	Name          string // source name in the Index (the replica)
	Address       string // dial mode: the publisher, e.g. tcp://10.0.0.5:5557
	Topic         string // dial mode: subscription prefix
	ReplayAddress string // optional
	// Bind mode: the SUB address turnout binds (shared through the Hub)
	// and the topic that identifies this endpoint's messages.
	Bind    string
	Pattern kvtopic.Pattern
}

// ManagerConfig holds subscriber tunables; zero values take the defaults
// of SubscriberConfig.
type ManagerConfig struct {
	MinBackoff    time.Duration
	MaxBackoff    time.Duration
	DialTimeout   time.Duration
	ReplayTimeout time.Duration
	// Hub owns bound sockets, shared between managers; nil: the manager
	// makes its own, closed with it.
	Hub *Hub
}

// Manager runs one Subscriber per endpoint, feeding an Index: batches are
// applied, gaps mark the source stale, restarts clear it.
type Manager struct {
	ctx context.Context
	idx *Index
	cfg ManagerConfig
	log zerolog.Logger

	mu     sync.Mutex
	subs   map[string]*managed
	closed bool
	ownHub bool
}

type managed struct {
	ep     Endpoint
	sub    *Subscriber
	cancel context.CancelFunc
	done   chan struct{}
	binder *Binder // bind mode, once bound; guarded by gate

	// gate makes "stopped" final: once active is false no callback can
	// touch the index, so RemoveSource cannot be undone by a late Apply.
	gate   sync.Mutex
	active bool
}

// NewManager returns a Manager whose subscribers live until ctx ends or
// Close is called.
func NewManager(ctx context.Context, idx *Index, cfg ManagerConfig, log *zerolog.Logger) *Manager {
	own := cfg.Hub == nil
	if own {
		cfg.Hub = NewHub(ctx, log)
	}
	return &Manager{
		ctx:    ctx,
		idx:    idx,
		cfg:    cfg,
		log:    loggerOrNop(log).With().Str("component", "kv-manager").Logger(),
		subs:   make(map[string]*managed),
		ownHub: own,
	}
}

// Sync makes the running subscribers match eps: new endpoints start,
// removed ones stop and their source is removed from the index, changed
// ones restart from scratch. Invalid entries are skipped and reported.
func (m *Manager) Sync(eps []Endpoint) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return errors.New("kv: manager closed")
	}
	var errs []error
	want := make(map[string]Endpoint, len(eps))
	for _, ep := range eps {
		switch {
		case ep.Name == "" || (ep.Address == "") == (ep.Bind == ""):
			errs = append(errs, fmt.Errorf("kv: endpoint %q: name and one of address (dial) or bind required", ep.Name))
			continue
		case want[ep.Name] != (Endpoint{}):
			errs = append(errs, fmt.Errorf("kv: duplicate endpoint name %q", ep.Name))
			continue
		}
		want[ep.Name] = ep
	}
	// A bind address stays bound across a stop and restart in one Sync.
	var held []*Binder
	defer func() {
		for _, b := range held {
			m.cfg.Hub.release(b)
		}
	}()
	for name, ms := range m.subs {
		if ep, ok := want[name]; !ok || ep != ms.ep {
			ms.gate.Lock()
			if b := ms.binder; b != nil {
				m.cfg.Hub.hold(b)
				held = append(held, b)
			}
			ms.gate.Unlock()
			m.stopLocked(ms)
		}
	}
	for name, ep := range want {
		if _, ok := m.subs[name]; ok {
			continue
		}
		if err := m.startLocked(ep); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (m *Manager) startLocked(ep Endpoint) error {
	ms := &managed{ep: ep, done: make(chan struct{}), active: true}
	addr := ep.Address
	if ep.Bind != "" {
		addr = ep.Bind
	}
	sub, err := NewSubscriber(SubscriberConfig{
		Name:          ep.Name,
		Address:       addr,
		Topic:         ep.Topic,
		ReplayAddress: ep.ReplayAddress,
		MinBackoff:    m.cfg.MinBackoff,
		MaxBackoff:    m.cfg.MaxBackoff,
		DialTimeout:   m.cfg.DialTimeout,
		ReplayTimeout: m.cfg.ReplayTimeout,
		OnBatch:       func(src string, b Batch) { ms.guard(func() { m.idx.Apply(src, b) }) },
		OnGap:         func(src string) { ms.guard(func() { m.idx.MarkStale(src) }) },
		OnRestart:     func(src string) { ms.guard(func() { m.idx.ClearSource(src) }) },
	}, &m.log)
	if err != nil {
		return fmt.Errorf("kv: endpoint %q: %w", ep.Name, err)
	}
	ms.sub = sub
	ctx, cancel := context.WithCancel(m.ctx)
	ms.cancel = cancel
	if ep.Bind != "" {
		m.subs[ep.Name] = ms
		if err := m.bind(ms); err != nil {
			// The address may be held by a process on its way out: keep
			// trying, as dial mode keeps redialing.
			go m.retryBind(ctx, ms)
			return fmt.Errorf("kv: endpoint %q: %w (retrying)", ep.Name, err)
		}
		close(ms.done)
		return nil
	}
	m.subs[ep.Name] = ms
	go func() {
		defer close(ms.done)
		_ = sub.Run(ctx)
	}()
	m.log.Info().Str("source", ep.Name).Str("addr", ep.Address).Msg("kv subscriber started")
	return nil
}

// bind attaches ms to its bound socket. The hub is never called under the
// gate: closing a binder waits for its receive loop, which takes the gate.
func (m *Manager) bind(ms *managed) error {
	b, err := m.cfg.Hub.acquire(ms.ep.Bind)
	if err != nil {
		return err
	}
	ms.gate.Lock()
	active := ms.active
	if active {
		ms.binder = b
		b.attach(ms.ep.Pattern, ms.sub)
	}
	ms.gate.Unlock()
	if !active { // stopped meanwhile
		m.cfg.Hub.release(b)
		return nil
	}
	m.log.Info().Str("source", ms.ep.Name).Str("bind", ms.ep.Bind).Stringer("topic", ms.ep.Pattern).Msg("kv endpoint attached to bound socket")
	return nil
}

func (m *Manager) retryBind(ctx context.Context, ms *managed) {
	defer close(ms.done)
	backoff := cmp.Or(m.cfg.MinBackoff, 100*time.Millisecond)
	maxBackoff := max(cmp.Or(m.cfg.MaxBackoff, 10*time.Second), backoff)
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		err := m.bind(ms)
		if err == nil {
			return
		}
		m.log.Warn().Err(err).Str("source", ms.ep.Name).Dur("retry_in", backoff).Msg("kv events: bind failed")
		backoff = min(2*backoff, maxBackoff)
	}
}

// unbind detaches ms from its socket, if it got one.
func (m *Manager) unbind(ms *managed) {
	ms.gate.Lock()
	b := ms.binder
	ms.binder = nil
	ms.gate.Unlock()
	if b != nil {
		b.detach(ms.sub)
		m.cfg.Hub.release(b)
	}
}

func (ms *managed) guard(f func()) {
	ms.gate.Lock()
	defer ms.gate.Unlock()
	if ms.active {
		f()
	}
}

func (m *Manager) stopLocked(ms *managed) {
	ms.gate.Lock()
	ms.active = false
	ms.gate.Unlock()
	ms.cancel()
	m.unbind(ms)
	delete(m.subs, ms.ep.Name)
	m.idx.RemoveSource(ms.ep.Name)
	m.log.Info().Str("source", ms.ep.Name).Msg("kv subscriber stopped")
}

// Stats returns each subscriber's counters by source name.
func (m *Manager) Stats() map[string]SubscriberStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]SubscriberStats, len(m.subs))
	for name, ms := range m.subs {
		out[name] = ms.sub.Stats()
	}
	return out
}

// Close stops every subscriber and waits (bounded) for them to exit. The
// index keeps its contents.
func (m *Manager) Close() {
	m.mu.Lock()
	m.closed = true
	subs := make([]*managed, 0, len(m.subs))
	for _, ms := range m.subs {
		ms.gate.Lock()
		ms.active = false
		ms.gate.Unlock()
		ms.cancel()
		m.unbind(ms)
		subs = append(subs, ms)
	}
	clear(m.subs)
	m.mu.Unlock()
	if m.ownHub {
		defer m.cfg.Hub.Close()
	}
	deadline := time.NewTimer(5 * time.Second)
	defer deadline.Stop()
	for _, ms := range subs {
		select {
		case <-ms.done:
		case <-deadline.C:
			m.log.Warn().Msg("kv subscribers slow to stop")
			return
		}
	}
}
