package cluster

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/turnout/turnout/route/fleet"
)

// Engine figures (engine_metrics.share): each replica is scraped by one
// instance, its owner, the highest rendezvous hash of the replica's name
// over the live instances, which publishes what it read on one subject
// for all pools, <subject>._engines (a pool name starts with a letter or
// digit, so it never takes that subject). Instances learn each other from
// these messages: one goes out after every scrape round that read
// something, and a heartbeat at least every heartbeat while there is
// nothing to say; an instance silent for three heartbeats has left, and
// the replicas it owned move to the others.
//
//	magic "TPE1", u8 len, origin instance name
//	records until the end: u8 len, endpoint name; u8 flags (1: the scrape
//	failed, no figures follow; 2: LoRA figures follow); uvarint next scrape
//	gap (ms); uvarint requests; uvarint waiting; f64 KV usage; uvarint
//	block size; f64 TTFT seconds; uvarint TTFT count; with flag 2: u8 n,
//	n names (running); u8 n, n names (waiting); uvarint max LoRA
const engineMagic = "TPE1"

const (
	figFailed = 1 << iota
	figLoRA
)

// engineSubject is the figures' subject token after cluster.subject.
const engineSubject = "._engines"

// heartbeat is the longest an instance stays silent on the figures
// subject; peers count it gone after three.
const heartbeat = time.Second

var errFigures = errors.New("engine figures out of range")

// engineShare is the Sync's side of engine_metrics.share.
type engineShare struct {
	selfSeed uint64
	mu       sync.Mutex
	pending  []byte // records since the last Flush
	lastSent time.Time
	// peers: origin -> last heard (unix ns), written by the subscription
	// and read by Flush; members the live ones' seeds, read by Owns.
	peers   map[string]int64
	members atomic.Pointer[[]uint64]
	fn      atomic.Pointer[func([]byte, *fleet.EngineLoad, time.Duration)]
	in, out atomic.Uint64 // figures received and sent
	bad     atomic.Uint64 // malformed figure messages
}

// nameSeed is the FNV-1a hash of a name: the same in every process.
func nameSeed(name string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(name); i++ {
		h ^= uint64(name[i])
		h *= 1099511628211
	}
	return h
}

// score is the rendezvous weight of an instance (by its seed) for an
// endpoint: the instance with the highest owns it.
func score(seed uint64, endpoint string) uint64 {
	h := seed ^ nameSeed(endpoint)
	// splitmix64's finalizer: spreads names that differ in one byte.
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	return h ^ h>>31
}

// Owns implements engineload.Share: whether this instance scrapes
// endpoint. Alone, or without NATS, it owns every replica.
func (s *Sync) Owns(endpoint string) bool {
	m := s.eng.members.Load()
	if m == nil || len(*m) == 0 || !s.connected.Load() {
		return true
	}
	self := score(s.eng.selfSeed, endpoint)
	for _, seed := range *m {
		if sc := score(seed, endpoint); sc > self || sc == self && seed > s.eng.selfSeed {
			return false
		}
	}
	return true
}

// Publish implements engineload.Share: queues the figures of an owned
// endpoint for the next Flush.
func (s *Sync) Publish(endpoint string, l *fleet.EngineLoad, next time.Duration) {
	if len(endpoint) == 0 || len(endpoint) > maxNameLen {
		return
	}
	s.eng.mu.Lock()
	defer s.eng.mu.Unlock()
	if len(s.eng.pending) > MaxMessageBytes/2 {
		s.flushLocked(time.Now())
	}
	s.eng.pending = appendFigures(s.eng.pending, endpoint, l, next)
	s.eng.out.Add(1)
}

// Flush implements engineload.Share: sends the queued figures, or a
// heartbeat when nothing went out for a while, and forgets the peers
// silent for three heartbeats.
func (s *Sync) Flush() {
	now := time.Now()
	s.eng.mu.Lock()
	defer s.eng.mu.Unlock()
	if len(s.eng.pending) > 0 || now.Sub(s.eng.lastSent) >= heartbeat {
		s.flushLocked(now)
	}
	gone := false
	for o, at := range s.eng.peers {
		if now.UnixNano()-at > int64(3*heartbeat) {
			delete(s.eng.peers, o)
			gone = true
		}
	}
	if gone {
		s.storeMembersLocked()
	}
}

func (s *Sync) flushLocked(now time.Time) {
	msg := make([]byte, 0, len(engineMagic)+1+len(s.name)+len(s.eng.pending))
	msg = append(msg, engineMagic...)
	msg = append(msg, byte(len(s.name)))
	msg = append(msg, s.name...)
	msg = append(msg, s.eng.pending...)
	s.eng.pending = s.eng.pending[:0]
	s.eng.lastSent = now
	if s.nc.Publish(s.cfg.Subject+engineSubject, msg) == nil {
		s.publishedMsgs.Add(1)
		s.publishedBytes.Add(uint64(len(msg)))
	}
}

// OnFigures implements engineload.Share.
func (s *Sync) OnFigures(fn func([]byte, *fleet.EngineLoad, time.Duration)) { s.eng.fn.Store(&fn) }

// subscribeEngines listens to the peers' figures (from New).
func (s *Sync) subscribeEngines() error {
	sub, err := s.nc.Subscribe(s.cfg.Subject+engineSubject, func(m *nats.Msg) { s.applyFigures(m.Data) })
	if err != nil {
		return fmt.Errorf("cluster: subscribe %s: %w", s.cfg.Subject+engineSubject, err)
	}
	_ = sub.SetPendingLimits(pendingMsgs, pendingBytes)
	s.subMu.Lock()
	s.engSub = sub
	s.subMu.Unlock()
	return nil
}

// applyFigures notes the sender as a live peer and hands its figures to
// the scraper; a malformed message is dropped whole.
func (s *Sync) applyFigures(data []byte) {
	s.receivedMsgs.Add(1)
	s.receivedBytes.Add(uint64(len(data)))
	if len(data) < len(engineMagic) || string(data[:len(engineMagic)]) != engineMagic {
		s.eng.bad.Add(1)
		return
	}
	origin, rest, err := readName(data[len(engineMagic):])
	switch {
	case err != nil:
		s.eng.bad.Add(1)
		return
	case string(origin) == s.name:
		s.recv[recvOwn].Add(1)
		return
	}
	for r := rest; len(r) > 0; {
		if _, _, _, r, err = nextFigures(r); err != nil {
			s.eng.bad.Add(1)
			s.log.Debug().Err(err).Str("origin", string(origin)).Msg("cluster: engine figures dropped")
			return
		}
	}
	s.notePeer(string(origin))
	fn := s.eng.fn.Load()
	for len(rest) > 0 {
		ep, l, next, tail, _ := nextFigures(rest)
		rest = tail
		s.eng.in.Add(1)
		if fn != nil {
			(*fn)(ep, l, next)
		}
	}
}

// notePeer records that origin is alive; a new one changes the owners.
func (s *Sync) notePeer(origin string) {
	s.eng.mu.Lock()
	defer s.eng.mu.Unlock()
	if s.eng.peers == nil {
		s.eng.peers = map[string]int64{}
	}
	_, known := s.eng.peers[origin]
	s.eng.peers[origin] = time.Now().UnixNano()
	if !known {
		s.storeMembersLocked()
	}
}

func (s *Sync) storeMembersLocked() {
	m := make([]uint64, 0, len(s.eng.peers))
	for o := range s.eng.peers {
		m = append(m, nameSeed(o))
	}
	slices.Sort(m)
	s.eng.members.Store(&m)
}

// Peers is the number of live peers this instance shares scrapes with.
func (s *Sync) Peers() int {
	if m := s.eng.members.Load(); m != nil {
		return len(*m)
	}
	return 0
}

func appendFigures(b []byte, endpoint string, l *fleet.EngineLoad, next time.Duration) []byte {
	b = append(b, byte(len(endpoint)))
	b = append(b, endpoint...)
	var flags byte
	switch {
	case l == nil:
		flags = figFailed
	case l.LoRA != nil:
		flags = figLoRA
	}
	b = append(b, flags)
	b = binary.AppendUvarint(b, uint64(max(0, next.Milliseconds())))
	if l == nil {
		return b
	}
	b = binary.AppendUvarint(b, uint64(max(0, l.Requests)))
	b = binary.AppendUvarint(b, uint64(max(0, l.Waiting)))
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(l.KVUsage))
	b = binary.AppendUvarint(b, uint64(max(0, l.BlockSize)))
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(l.TTFTSeconds))
	b = binary.AppendUvarint(b, l.TTFTCount)
	if l.LoRA != nil {
		b = appendNames(b, l.LoRA.Running)
		b = appendNames(b, l.LoRA.Waiting)
		b = binary.AppendUvarint(b, uint64(max(0, l.LoRA.MaxLoRA)))
	}
	return b
}

func appendNames(b []byte, names []string) []byte {
	n := 0
	at := len(b)
	b = append(b, 0)
	for _, a := range names {
		if len(a) == 0 || len(a) > maxNameLen || n == 255 {
			continue
		}
		b = append(b, byte(len(a)))
		b = append(b, a...)
		n++
	}
	b[at] = byte(n)
	return b
}

// nextFigures decodes one record; every length and range is checked.
func nextFigures(b []byte) (endpoint []byte, l *fleet.EngineLoad, next time.Duration, rest []byte, err error) {
	if endpoint, b, err = readName(b); err != nil {
		return nil, nil, 0, nil, fmt.Errorf("endpoint: %w", err)
	}
	if len(b) < 1 {
		return nil, nil, 0, nil, errTruncated
	}
	flags := b[0]
	b = b[1:]
	var ms uint64
	if ms, b, err = uvarint(b, uint64(time.Hour/time.Millisecond)); err != nil {
		return nil, nil, 0, nil, fmt.Errorf("next: %w", err)
	}
	next = time.Duration(ms) * time.Millisecond
	if flags&figFailed != 0 {
		return endpoint, nil, next, b, nil
	}
	l = &fleet.EngineLoad{}
	var v uint64
	if v, b, err = uvarint(b, maxLevel); err != nil {
		return nil, nil, 0, nil, fmt.Errorf("requests: %w", err)
	}
	l.Requests = int64(v)
	if v, b, err = uvarint(b, maxLevel); err != nil {
		return nil, nil, 0, nil, fmt.Errorf("waiting: %w", err)
	}
	l.Waiting = int64(v)
	if len(b) < 8 {
		return nil, nil, 0, nil, errTruncated
	}
	l.KVUsage = math.Float64frombits(binary.LittleEndian.Uint64(b))
	if math.IsNaN(l.KVUsage) || l.KVUsage < -1 || l.KVUsage > 1 {
		return nil, nil, 0, nil, fmt.Errorf("kv usage %g: %w", l.KVUsage, errFigures)
	}
	b = b[8:]
	if v, b, err = uvarint(b, 4096); err != nil {
		return nil, nil, 0, nil, fmt.Errorf("block size: %w", err)
	}
	l.BlockSize = int(v)
	if len(b) < 8 {
		return nil, nil, 0, nil, errTruncated
	}
	l.TTFTSeconds = math.Float64frombits(binary.LittleEndian.Uint64(b))
	if math.IsNaN(l.TTFTSeconds) || math.IsInf(l.TTFTSeconds, 0) || l.TTFTSeconds < 0 {
		return nil, nil, 0, nil, fmt.Errorf("ttft seconds %g: %w", l.TTFTSeconds, errFigures)
	}
	b = b[8:]
	if l.TTFTCount, b, err = uvarint(b, math.MaxUint64); err != nil {
		return nil, nil, 0, nil, fmt.Errorf("ttft count: %w", err)
	}
	if flags&figLoRA != 0 {
		lo := &fleet.LoRAState{}
		if lo.Running, b, err = readNames(b); err != nil {
			return nil, nil, 0, nil, fmt.Errorf("running adapters: %w", err)
		}
		if lo.Waiting, b, err = readNames(b); err != nil {
			return nil, nil, 0, nil, fmt.Errorf("waiting adapters: %w", err)
		}
		if v, b, err = uvarint(b, 1<<16); err != nil {
			return nil, nil, 0, nil, fmt.Errorf("max lora: %w", err)
		}
		lo.MaxLoRA = int(v)
		l.LoRA = lo
	}
	return endpoint, l, next, b, nil
}

func uvarint(b []byte, limit uint64) (uint64, []byte, error) {
	v, k := binary.Uvarint(b)
	if k <= 0 {
		return 0, nil, errTruncated
	}
	if v > limit {
		return 0, nil, errFigures
	}
	return v, b[k:], nil
}

func readNames(b []byte) ([]string, []byte, error) {
	if len(b) < 1 {
		return nil, nil, errTruncated
	}
	n := int(b[0])
	b = b[1:]
	var out []string
	for range n {
		var name []byte
		var err error
		if name, b, err = readName(b); err != nil {
			return nil, nil, err
		}
		out = append(out, string(name))
	}
	return out, b, nil
}
