package kv

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"
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
	Pattern TopicPattern
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
	binder *Binder // bind mode

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
			if ms.binder != nil {
				m.cfg.Hub.hold(ms.binder)
				held = append(held, ms.binder)
			}
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
		b, err := m.cfg.Hub.acquire(ep.Bind)
		if err != nil {
			cancel()
			return fmt.Errorf("kv: endpoint %q: %w", ep.Name, err)
		}
		ms.binder = b
		b.attach(ep.Pattern, sub)
		close(ms.done)
		m.subs[ep.Name] = ms
		m.log.Info().Str("source", ep.Name).Str("bind", ep.Bind).Stringer("topic", ep.Pattern).Msg("kv endpoint attached to bound socket")
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
	if ms.binder != nil {
		ms.binder.detach(ms.sub)
		m.cfg.Hub.release(ms.binder)
	}
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
		if ms.binder != nil {
			ms.binder.detach(ms.sub)
			m.cfg.Hub.release(ms.binder)
		}
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
