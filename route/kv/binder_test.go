package kv

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"testing"

	"github.com/go-zeromq/zmq4"

	"github.com/turnout/turnout/internal/kvtopic"
	"github.com/turnout/turnout/lab/testenv/freeport"
)

// freeTCP is a ZMQ endpoint on a loopback port free a moment ago (freeport:
// outside the ephemeral range, which hands a closed port straight back).
func freeTCP(t *testing.T) string {
	t.Helper()
	return "tcp://" + freeport.Addr(t)
}

// TestBindMode: four publishers connect to one bound SUB; each one's events
// land on its own endpoint by topic, an unknown topic is counted and
// dropped, and sequence restarts and gaps are judged per publisher.
func TestBindMode(t *testing.T) {
	ctx := t.Context()
	bind := freeTCP(t)
	hub := NewHub(ctx, nil)
	defer hub.Close()
	cfg := fastManager
	cfg.Hub = hub
	ix := NewIndex(1000)
	m := NewManager(ctx, ix, cfg, nil)
	defer m.Close()
	const n = 4
	var eps []Endpoint
	for i := range n {
		p, err := kvtopic.Compile(kvtopic.DefaultTemplate, fmt.Sprintf("r%d", i), fmt.Sprintf("127.0.0.1:%d", 8000+i))
		if err != nil {
			t.Fatal(err)
		}
		eps = append(eps, Endpoint{Name: fmt.Sprintf("r%d", i), Bind: bind, Pattern: p})
	}
	if err := m.Sync(eps); err != nil {
		t.Fatal(err)
	}
	newPub := func(topic string) *Publisher {
		pctx, cancel := context.WithCancel(ctx)
		t.Cleanup(cancel)
		p, err := NewPublisherWithConfig(pctx, PublisherConfig{Connect: bind, Topic: topic}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		return p
	}
	pubs := make([]*Publisher, n)
	for i := range pubs {
		pubs[i] = newPub(fmt.Sprintf("kv@127.0.0.1:%d@llama", 8000+i))
	}
	stranger := newPub("kv@127.0.0.1:9999@llama")

	const bs = 4
	toks := make([][]uint32, n)
	keys := make([][]uint64, n)
	for i := range toks {
		toks[i] = seqTokens(bs, uint32(100*i+1))
		keys[i] = BlockKeys(toks[i], bs, nil)
	}
	for i, p := range pubs {
		eventually(t, fmt.Sprintf("r%d's block indexed", i), func() bool {
			if !p.subscribed() {
				return false
			}
			p.BlocksStored([]uint64{uint64(10 + i)}, 0, false, toks[i], bs)
			return match1(ix, keys[i], fmt.Sprintf("r%d", i)) == 1
		})
	}
	for i := range n {
		for j := range n {
			if got := match1(ix, keys[i], fmt.Sprintf("r%d", j)); (got == 1) != (i == j) {
				t.Fatalf("r%d holds %d blocks of publisher %d's prompt", j, got, i)
			}
		}
	}
	eventually(t, "unknown topic counted", func() bool {
		stranger.BlocksStored([]uint64{99}, 0, false, toks[0], bs)
		return hub.Stats()[bind].UnknownTopics > 0
	})
	if st := ix.Stats(); st.Entries < n {
		t.Fatalf("index %+v", st)
	}

	// Publisher 1 restarts (a new process numbering from 0 again, same
	// topic): only r1 is cleared; the others keep their blocks.
	_ = pubs[1].Close()
	pubs[1] = newPub("kv@127.0.0.1:8001@llama")
	eventually(t, "r1's new publisher connected", pubs[1].subscribed)
	eventually(t, "r1 restart detected", func() bool {
		pubs[1].AllBlocksCleared() // seq 0 < r1's last: a restart
		return m.Stats()["r1"].Restarts > 0
	})
	for _, i := range []int{0, 2, 3} {
		if got := match1(ix, keys[i], fmt.Sprintf("r%d", i)); got != 1 {
			t.Fatalf("r%d lost its block when r1 restarted", i)
		}
		if st := m.Stats()[fmt.Sprintf("r%d", i)]; st.Restarts != 0 || st.Gaps != 0 {
			t.Fatalf("r%d: %+v", i, st)
		}
	}

	// Dropping every endpoint unbinds the address; it can be bound again.
	if err := m.Sync(nil); err != nil {
		t.Fatal(err)
	}
	if len(hub.Stats()) != 0 {
		t.Fatalf("still bound: %v", hub.Stats())
	}
	if err := m.Sync(eps[:1]); err != nil {
		t.Fatalf("rebind: %v", err)
	}
}

// TestBindModeAppliesGoodEventsOfBadBatch: a batch whose middle event is bad
// still stores and removes the others; the rejection is counted by reason.
func TestIndexAppliesRestOfBatch(t *testing.T) {
	const bs = 2
	raw := enc(t, arr{1.0, arr{
		arr{"BlockStored", arr{1}, nil, arr{5, 6}, bs},
		arr{"BlockStored", arr{2}, 1, arr{-7, 8}, bs}, // negative token id
		arr{"BlockStored", arr{3}, 0, arr{uint64(1) << 31, 9}, bs},
		arr{"BlockRemoved", arr{1}},
	}}, true)
	b, err := DecodeBatch(raw)
	if err != nil {
		t.Fatal(err)
	}
	ix := NewIndex(100)
	ix.Apply("r", b)
	if b.Rejected[RejectTokenRange] != 1 || len(b.Events) != 3 {
		t.Fatalf("batch %+v", b)
	}
	if got := match1(ix, BlockKeys([]uint32{1 << 31, 9}, bs, nil), "r"); got != 1 {
		t.Fatalf("block with parent 0 and id 2^31 not indexed (%d)", got)
	}
	if got := match1(ix, BlockKeys([]uint32{5, 6}, bs, nil), "r"); got != 0 {
		t.Fatalf("the removal after the bad event was not applied (%d)", got)
	}
}

// TestPublisherConnectsBeforeBind: a publisher started before turnout keeps
// redialing and is picked up once the SUB binds (engines start first).
func TestPublisherConnectsBeforeBind(t *testing.T) {
	ctx := t.Context()
	bind := freeTCP(t)
	p, err := NewPublisherWithConfig(ctx, PublisherConfig{Connect: bind, Topic: "kv@h:1@m"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	hub := NewHub(ctx, nil)
	defer hub.Close()
	cfg := fastManager
	cfg.Hub = hub
	m := NewManager(ctx, NewIndex(100), cfg, nil)
	defer m.Close()
	pat, _ := kvtopic.Compile(kvtopic.DefaultTemplate, "r", "h:1")
	if err := m.Sync([]Endpoint{{Name: "r", Bind: bind, Pattern: pat}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "publisher connected", p.subscribed)
	eventually(t, "event delivered", func() bool {
		p.AllBlocksCleared()
		return m.Stats()["r"].Events > 0
	})
}

// TestBindRetries: an address still held by someone else (an old process
// on its way out) is bound as soon as it is free.
func TestBindRetries(t *testing.T) {
	ctx := t.Context()
	holder, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	bind := "tcp://" + holder.Addr().String()
	hub := NewHub(ctx, nil)
	defer hub.Close()
	cfg := fastManager
	cfg.Hub = hub
	m := NewManager(ctx, NewIndex(100), cfg, nil)
	defer m.Close()
	pat, _ := kvtopic.Compile(kvtopic.DefaultTemplate, "r", "h:1")
	if err := m.Sync([]Endpoint{{Name: "r", Bind: bind, Pattern: pat}}); err == nil {
		t.Fatal("bind on a held address reported no error")
	}
	_ = holder.Close()
	eventually(t, "bound after the address was freed", func() bool { return len(hub.Stats()) == 1 })
	p, err := NewPublisherWithConfig(ctx, PublisherConfig{Connect: bind, Topic: "kv@h:1@m"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	eventually(t, "event delivered", func() bool {
		p.AllBlocksCleared()
		return m.Stats()["r"].Events > 0
	})
}

// TestBindModeGapsPerPublisher: interleaved publishers on one socket keep
// their own sequence: one's gap is not the other's.
func TestBindModeGapsPerPublisher(t *testing.T) {
	ctx := t.Context()
	bind := freeTCP(t)
	hub := NewHub(ctx, nil)
	defer hub.Close()
	cfg := fastManager
	cfg.Hub = hub
	m := NewManager(ctx, NewIndex(100), cfg, nil)
	defer m.Close()
	var eps []Endpoint
	for i := range 2 {
		p, _ := kvtopic.Compile(kvtopic.DefaultTemplate, fmt.Sprintf("r%d", i), fmt.Sprintf("127.0.0.1:%d", 8000+i))
		eps = append(eps, Endpoint{Name: fmt.Sprintf("r%d", i), Bind: bind, Pattern: p})
	}
	if err := m.Sync(eps); err != nil {
		t.Fatal(err)
	}
	payload, err := EncodeBatch(Batch{Events: []Event{{Kind: EventAllBlocksCleared}}}, false)
	if err != nil {
		t.Fatal(err)
	}
	pubs := make([]zmq4.Socket, 2)
	for i := range pubs {
		pubs[i] = zmq4.NewPub(ctx)
		defer pubs[i].Close()
		if err := pubs[i].Dial(bind); err != nil {
			t.Fatal(err)
		}
		eventually(t, "subscription reached the publisher", func() bool { return len(pubs[i].(zmq4.Topics).Topics()) > 0 })
	}
	send := func(i int, seq uint64) {
		var s [8]byte
		binary.BigEndian.PutUint64(s[:], seq)
		if err := pubs[i].Send(zmq4.NewMsgFrom([]byte(fmt.Sprintf("kv@127.0.0.1:%d@m", 8000+i)), s[:], payload)); err != nil {
			t.Fatal(err)
		}
	}
	send(0, 0)
	send(1, 0)
	send(0, 1)
	send(1, 5) // r1 lost 1..4
	send(0, 2)
	eventually(t, "all delivered", func() bool { return m.Stats()["r0"].Events == 3 && m.Stats()["r1"].Messages == 2 })
	if g0, g1 := m.Stats()["r0"].Gaps, m.Stats()["r1"].Gaps; g0 != 0 || g1 != 1 {
		t.Fatalf("gaps r0=%d r1=%d, want 0 and 1", g0, g1)
	}
}
