package kv

import (
	"context"
	"encoding/binary"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// eventually polls cond until it holds or a generous deadline passes; the
// deadline only bounds failure, success returns as soon as cond is true.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

var fastManager = ManagerConfig{MinBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, DialTimeout: time.Second, ReplayTimeout: time.Second}

func match1(ix *Index, keys []uint64, src string) int { return match(ix, keys, src)[0] }

func TestEndToEnd(t *testing.T) {
	ctx := t.Context()
	pub, err := NewPublisher(ctx, "tcp://127.0.0.1:0", "kv-events", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	ix := NewIndex(1000)
	m := NewManager(ctx, ix, fastManager, nil)
	defer m.Close()
	if err := m.Sync([]Endpoint{
		{Name: "r1", Address: pub.Addr(), Topic: "kv"}, // prefix of the topic
		{Name: "r2", Address: pub.Addr(), Topic: "kv-events"},
		{Name: "other", Address: pub.Addr(), Topic: "nope"},
	}); err != nil {
		t.Fatal(err)
	}

	const bs = 16
	toks := seqTokens(3*bs+5, 1)
	keys := BlockKeys(toks, bs, nil)
	// ZMQ drops what is published before a subscription lands (slow
	// joiner), so publish until both subscribers have seen it.
	eventually(t, "blocks indexed for r1 and r2", func() bool {
		pub.BlocksStored([]uint64{101, 102, 103}, 0, false, toks[:3*bs], bs)
		return match1(ix, keys, "r1") == 3 && match1(ix, keys, "r2") == 3
	})
	if got := match1(ix, keys, "other"); got != 0 {
		t.Fatalf("subscriber with a non-matching topic indexed %d blocks", got)
	}

	pub.AllBlocksCleared()
	eventually(t, "clear applied", func() bool { return match1(ix, keys, "r1") == 0 && match1(ix, keys, "r2") == 0 })
	pub.BlocksStored([]uint64{201}, 0, false, toks[:bs], bs)
	pub.BlocksStored([]uint64{202}, 201, true, toks[bs:2*bs], bs)
	pub.BlocksRemoved([]uint64{201})
	eventually(t, "chain then remove", func() bool {
		st := m.Stats()["r1"]
		return st.Events >= 3 && match1(ix, keys, "r1") == 0 && ix.Stats().Entries == 2 // 202 for r1 and r2
	})

	// Removing r1 stops it for good: r2 seeing later events proves r1
	// had its chance to (wrongly) apply them too.
	if err := m.Sync([]Endpoint{{Name: "r2", Address: pub.Addr(), Topic: "kv-events"}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "r2 sees blocks after r1's removal", func() bool {
		pub.BlocksStored([]uint64{301}, 0, false, toks[:bs], bs)
		return match1(ix, keys, "r2") == 2 // 301 plus the 202 still held
	})
	for _, s := range ix.Sources() {
		if s.Name != "r2" {
			t.Fatalf("source %q still in the index after Sync removed it", s.Name)
		}
	}
	st := m.Stats()
	if _, ok := st["r1"]; ok || st["r2"].Gaps != 0 || st["r2"].Malformed != 0 || !st["r2"].Connected {
		t.Fatalf("manager stats %+v", st)
	}
	if ps := pub.Stats(); ps.Sent == 0 || ps.Dropped != 0 {
		t.Fatalf("publisher stats %+v", ps)
	}

	start := time.Now()
	m.Close()
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Manager.Close took %v", d)
	}
	if err := m.Sync(nil); err == nil {
		t.Fatal("Sync after Close succeeded")
	}
}

func TestManagerSyncValidation(t *testing.T) {
	m := NewManager(t.Context(), NewIndex(10), fastManager, nil)
	defer m.Close()
	err := m.Sync([]Endpoint{
		{Name: "a", Address: "tcp://127.0.0.1:1"},
		{Name: "a", Address: "tcp://127.0.0.1:2"},
		{Name: "", Address: "tcp://127.0.0.1:3"},
		{Name: "b"},
	})
	if err == nil {
		t.Fatal("want errors for duplicate and incomplete endpoints")
	}
	if st := m.Stats(); len(st) != 1 {
		t.Fatalf("running subscribers %v, want only a", st)
	}
	// Unreachable endpoint: the subscriber keeps retrying with backoff.
	eventually(t, "dial retries", func() bool { return m.Stats()["a"].Reconnects >= 2 })
}

// rawPub is a bare zmq4 PUB socket for hand-made sequence numbers.
type rawPub struct {
	t    *testing.T
	sock zmq4.Socket
	addr string
}

func newRawPub(t *testing.T) *rawPub {
	s := zmq4.NewPub(t.Context())
	if err := s.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return &rawPub{t: t, sock: s, addr: "tcp://" + s.Addr().String()}
}

func (p *rawPub) waitSubscribed() {
	eventually(p.t, "subscription", func() bool { return len(p.sock.(zmq4.Topics).Topics()) > 0 })
}

func seqBytes(seq uint64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, seq)
	return b
}

func (p *rawPub) send(frames ...[]byte) {
	p.t.Helper()
	if err := p.sock.SendMulti(zmq4.NewMsgFrom(frames...)); err != nil {
		p.t.Fatal(err)
	}
}

func storePayload(t *testing.T, hash, parent uint64, toks []uint32) []byte {
	t.Helper()
	b := Batch{TS: 1, HasDPRank: true, Events: []Event{stored([]uint64{hash}, parent, parent != 0, toks, len(toks))}}
	raw, err := EncodeBatch(b, true)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

type recorder struct {
	ix             *Index
	subscriber     *Subscriber
	gaps, restarts atomic.Int32
	runDone        chan struct{}
}

func startSubscriber(t *testing.T, cfg SubscriberConfig) *recorder {
	r := &recorder{ix: NewIndex(100), runDone: make(chan struct{})}
	cfg.Name = "r"
	cfg.MinBackoff, cfg.MaxBackoff = 5*time.Millisecond, 50*time.Millisecond
	cfg.OnBatch = r.ix.Apply
	cfg.OnGap = func(src string) { r.gaps.Add(1); r.ix.MarkStale(src) }
	cfg.OnRestart = func(src string) { r.restarts.Add(1); r.ix.ClearSource(src) }
	s, err := NewSubscriber(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.subscriber = s
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		defer close(r.runDone)
		_ = s.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.runDone:
		case <-time.After(3 * time.Second):
			t.Error("Subscriber.Run did not return after cancel")
		}
	})
	return r
}

func TestSubscriberSequence(t *testing.T) {
	p := newRawPub(t)
	r := startSubscriber(t, SubscriberConfig{Address: p.addr})
	p.waitSubscribed()

	const bs = 2
	toks := seqTokens(4*bs, 1)
	keys := BlockKeys(toks, bs, nil)
	msgs := func(n uint64) func() bool {
		return func() bool { return r.subscriber.Stats().Messages >= n }
	}

	p.send(nil, seqBytes(0), storePayload(t, 1, 0, toks[:bs]))
	p.send(nil, seqBytes(1), storePayload(t, 2, 1, toks[bs:2*bs]))
	eventually(t, "two messages", msgs(2))
	if st := r.subscriber.Stats(); st.Gaps != 0 || r.gaps.Load() != 0 || r.ix.Stale("r") {
		t.Fatalf("gap reported for contiguous sequence: %+v", st)
	}
	// seq 2 never sent.
	p.send(nil, seqBytes(3), storePayload(t, 4, 3, toks[3*bs:]))
	eventually(t, "third message", msgs(3))
	if st := r.subscriber.Stats(); st.Gaps != 1 || r.gaps.Load() != 1 || !r.ix.Stale("r") {
		t.Fatalf("gap not reported: %+v, callbacks %d", st, r.gaps.Load())
	}
	if got := match1(r.ix, keys, "r"); got != 2 {
		t.Fatalf("Match = %d, want 2 (the gap's child is an orphan)", got)
	}

	// Malformed payload and malformed framing: counted, skipped, no stall.
	p.send(nil, seqBytes(4), []byte{0xc1, 0x00})
	p.send(nil, []byte{1, 2, 3}, storePayload(t, 9, 0, toks[:bs]))
	p.send(nil, seqBytes(5), storePayload(t, 5, 0, seqTokens(bs, 900)))
	eventually(t, "six messages", msgs(6))
	st := r.subscriber.Stats()
	if st.Malformed != 2 || st.Gaps != 1 || st.LastSeq != 5 || !st.HaveSeq || st.Events != 4 {
		t.Fatalf("after malformed: %+v", st)
	}
	if got := match1(r.ix, BlockKeys(seqTokens(bs, 900), bs, nil), "r"); got != 1 {
		t.Fatal("valid message after malformed ones was not applied")
	}

	// Sequence back to 0: the replica restarted.
	p.send(nil, seqBytes(0), storePayload(t, 7, 0, toks[:bs]))
	eventually(t, "restart message", msgs(7))
	if st := r.subscriber.Stats(); st.Restarts != 1 || r.restarts.Load() != 1 {
		t.Fatalf("restart not reported: %+v", st)
	}
	if r.ix.Stale("r") || match1(r.ix, keys, "r") != 1 || r.ix.Stats().Entries != 1 {
		t.Fatalf("restart did not reset the source: stale=%v entries=%d", r.ix.Stale("r"), r.ix.Stats().Entries)
	}
}

func TestSubscriberReplay(t *testing.T) {
	const bs = 2
	toks := seqTokens(3*bs, 1)
	keys := BlockKeys(toks, bs, nil)
	buffer := [][]byte{
		storePayload(t, 1, 0, toks[:bs]),
		storePayload(t, 2, 1, toks[bs:2*bs]),
		storePayload(t, 3, 2, toks[2*bs:]),
	}
	// A ROUTER behaving like vLLM's ZmqEventPublisher._service_replay.
	router := zmq4.NewRouter(t.Context())
	if err := router.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	defer router.Close()
	var requests atomic.Int32
	go func() {
		for {
			msg, err := router.Recv()
			if err != nil {
				return
			}
			if len(msg.Frames) != 3 || len(msg.Frames[1]) != 0 {
				t.Errorf("replay request frames %q, want [id, \"\", start]", msg.Frames)
				continue
			}
			requests.Add(1)
			id, start := msg.Frames[0], binary.BigEndian.Uint64(msg.Frames[2])
			for seq := start; seq < uint64(len(buffer)); seq++ {
				_ = router.SendMulti(zmq4.NewMsgFrom(id, nil, seqBytes(seq), buffer[seq]))
			}
			_ = router.SendMulti(zmq4.NewMsgFrom(id, nil, seqBytes(endSeq), nil))
		}
	}()

	p := newRawPub(t)
	r := startSubscriber(t, SubscriberConfig{Address: p.addr, ReplayAddress: "tcp://" + router.Addr().String()})
	p.waitSubscribed()
	p.send([]byte{}, seqBytes(0), buffer[0])
	p.send([]byte{}, seqBytes(2), buffer[2]) // seq 1 only in the replay buffer
	// Messages counts a message as it arrives, before its gap is
	// replayed: wait for the three batches' events instead.
	eventually(t, "both messages and the replayed batch", func() bool { return r.subscriber.Stats().Events >= 3 })
	st := r.subscriber.Stats()
	if st.Gaps != 1 || st.Replayed != 1 || r.gaps.Load() != 0 || r.ix.Stale("r") || requests.Load() != 1 {
		t.Fatalf("replay: %+v, gap callbacks %d, requests %d", st, r.gaps.Load(), requests.Load())
	}
	if got := match1(r.ix, keys, "r"); got != 3 {
		t.Fatalf("Match = %d, want 3 with the replayed block", got)
	}
}

func TestPublisherReplayServer(t *testing.T) {
	ctx := t.Context()
	pub, err := NewPublisherWithConfig(ctx, PublisherConfig{Addr: "tcp://127.0.0.1:0", ReplayAddr: "tcp://127.0.0.1:0", ReplayBuffer: 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	pub.BlocksRemoved([]uint64{10})
	pub.BlocksRemoved([]uint64{11})
	pub.BlocksRemoved([]uint64{12}) // ring of 2: seq 0 falls out
	eventually(t, "three sent", func() bool { return pub.Stats().Sent == 3 })

	// A DEALER speaking like vLLM's example subscriber.
	d := zmq4.NewDealer(ctx)
	defer d.Close()
	if err := d.Dial(pub.ReplayAddr()); err != nil {
		t.Fatal(err)
	}
	if err := d.SendMulti(zmq4.NewMsgFrom([]byte{}, seqBytes(0))); err != nil {
		t.Fatal(err)
	}
	var seqs, hashes []uint64
	for {
		msg, err := d.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(msg.Frames) != 3 || len(msg.Frames[0]) != 0 {
			t.Fatalf("reply frames %q, want [\"\", seq, payload]", msg.Frames)
		}
		seq := binary.BigEndian.Uint64(msg.Frames[1])
		if seq == endSeq {
			if len(msg.Frames[2]) != 0 {
				t.Fatal("end marker with a payload")
			}
			break
		}
		b, err := DecodeBatch(msg.Frames[2])
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, seq)
		hashes = append(hashes, b.Events[0].BlockHashes[0])
	}
	if len(seqs) != 2 || seqs[0] != 1 || seqs[1] != 2 || hashes[0] != 11 || hashes[1] != 12 {
		t.Fatalf("replayed seqs %v hashes %v, want [1 2] [11 12]", seqs, hashes)
	}
	if pub.Stats().ReplayRequests != 1 {
		t.Fatalf("stats %+v", pub.Stats())
	}
	if err := pub.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if pub.Publish([]Event{{Kind: EventAllBlocksCleared}}) || pub.Stats().Dropped != 1 {
		t.Fatal("Publish after Close was not dropped")
	}
}

func TestSubscriberSurvivesPublisherRestart(t *testing.T) {
	ctx := t.Context()
	pub1, err := NewPublisher(ctx, "tcp://127.0.0.1:0", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := pub1.Addr()
	ix := NewIndex(100)
	m := NewManager(ctx, ix, fastManager, nil)
	defer m.Close()
	if err := m.Sync([]Endpoint{{Name: "r", Address: addr}}); err != nil {
		t.Fatal(err)
	}
	const bs = 2
	before, after := seqTokens(bs, 1), seqTokens(bs, 500)
	kb, ka := BlockKeys(before, bs, nil), BlockKeys(after, bs, nil)
	eventually(t, "first publisher's block", func() bool {
		pub1.BlocksStored([]uint64{1}, 0, false, before, bs)
		return match1(ix, kb, "r") == 1
	})
	pub1.Close()
	eventually(t, "disconnect noticed", func() bool { return !m.Stats()["r"].Connected })

	// Same address, fresh sequence numbers, as after a replica restart.
	var pub2 *Publisher
	eventually(t, "rebind", func() bool {
		pub2, err = NewPublisher(ctx, addr, "", nil)
		return err == nil
	})
	defer pub2.Close()
	eventually(t, "resubscribed", pub2.subscribed)
	pub2.BlocksStored([]uint64{2}, 0, false, after, bs)
	eventually(t, "second publisher's block", func() bool { return match1(ix, ka, "r") == 1 })
	st := m.Stats()["r"]
	if st.Reconnects < 1 || st.Restarts != 1 {
		t.Fatalf("stats %+v, want a reconnect and a restart", st)
	}
	if got := match1(ix, kb, "r"); got != 0 {
		t.Fatal("restart did not clear the old replica's blocks")
	}
}

func TestClassifySeq(t *testing.T) {
	tests := []struct {
		have      bool
		last, seq uint64
		want      seqVerdict
	}{
		{false, 0, 0, seqNext},
		{false, 0, 77, seqNext}, // joined late: nothing to compare with
		{true, 0, 1, seqNext},
		{true, 5, 6, seqNext},
		{true, 5, 7, seqGap},
		{true, 5, 5, seqRestart},
		{true, 5, 0, seqRestart},
		{true, 0, 0, seqRestart},
		{true, ^uint64(0) - 1, ^uint64(0), seqNext},
		{true, 1, ^uint64(0), seqGap},
	}
	for _, tc := range tests {
		if got := classifySeq(tc.have, tc.last, tc.seq); got != tc.want {
			t.Errorf("classifySeq(%v, %d, %d) = %d, want %d", tc.have, tc.last, tc.seq, got, tc.want)
		}
	}
}

func TestPublisherDropsWhenFull(t *testing.T) {
	// No sender goroutine: the queue fills and stays full.
	p := &Publisher{ch: make(chan []byte, 1), log: *loggerOrNop(nil)}
	p.BlocksStored([]uint64{1}, 0, false, []uint32{1}, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.BlocksRemoved([]uint64{1})
		p.AllBlocksCleared()
	}()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("publishing to a full queue blocked")
	}
	if st := p.Stats(); st.Dropped != 2 {
		t.Fatalf("stats %+v, want 2 dropped", st)
	}
}

func TestNewSubscriberValidation(t *testing.T) {
	if _, err := NewSubscriber(SubscriberConfig{OnBatch: func(string, Batch) {}}, nil); err == nil {
		t.Fatal("no address accepted")
	}
	if _, err := NewSubscriber(SubscriberConfig{Address: "tcp://127.0.0.1:1"}, nil); err == nil {
		t.Fatal("no OnBatch accepted")
	}
	s, err := NewSubscriber(SubscriberConfig{Address: "tcp://127.0.0.1:1", OnBatch: func(string, Batch) {}}, nil)
	if err != nil || s.cfg.Name != s.cfg.Address || s.cfg.MaxBackoff < s.cfg.MinBackoff {
		t.Fatalf("defaults not applied: %+v, %v", s.cfg, err)
	}
}
