package cluster

import (
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/turnout/turnout/lab/testenv/natstest"
	"github.com/turnout/turnout/route/fleet"
)

// Figures survive the wire whole, and a record cut anywhere or out of
// range is refused, never half read.
func TestEngineFiguresWire(t *testing.T) {
	full := &fleet.EngineLoad{Requests: 12, Waiting: 3, KVUsage: 0.75, BlockSize: 16, TTFTSeconds: 4.5, TTFTCount: 90,
		LoRA: &fleet.LoRAState{Running: []string{"sql", "chat"}, Waiting: []string{"law"}, MaxLoRA: 4}}
	noLoRA := &fleet.EngineLoad{Requests: 1, KVUsage: -1}
	var b []byte
	b = appendFigures(b, "m0", full, 250*time.Millisecond)
	b = appendFigures(b, "m1", nil, 2*time.Second)
	b = appendFigures(b, "m2", noLoRA, time.Second)
	want := []struct {
		ep   string
		l    *fleet.EngineLoad
		next time.Duration
	}{{"m0", full, 250 * time.Millisecond}, {"m1", nil, 2 * time.Second}, {"m2", noLoRA, time.Second}}
	rest := b
	for _, w := range want {
		ep, l, next, tail, err := nextFigures(rest)
		if err != nil {
			t.Fatalf("%s: %v", w.ep, err)
		}
		if string(ep) != w.ep || next != w.next || !reflect.DeepEqual(l, w.l) {
			t.Fatalf("decoded %s %+v %s, want %s %+v %s", ep, l, next, w.ep, w.l, w.next)
		}
		rest = tail
	}
	if len(rest) != 0 {
		t.Fatalf("%d bytes left over", len(rest))
	}
	one := appendFigures(nil, "m0", full, time.Second)
	for n := 0; n < len(one); n++ {
		if _, _, _, _, err := nextFigures(one[:n]); err == nil {
			t.Fatalf("a record cut at %d of %d bytes decoded", n, len(one))
		}
	}
	bad := appendFigures(nil, "m0", &fleet.EngineLoad{KVUsage: 7}, time.Second)
	if _, _, _, _, err := nextFigures(bad); err == nil {
		t.Fatal("KV usage 7 decoded")
	}
}

// Rendezvous ownership: each replica has exactly one owner among the
// live instances, replicas spread evenly, and when an instance leaves only
// its replicas move.
func TestEngineOwners(t *testing.T) {
	names := make([]string, 8)
	for i := range names {
		names[i] = fmt.Sprintf("front-%d", i)
	}
	cluster := func(live []string) []*Sync {
		var out []*Sync
		for _, n := range live {
			s := &Sync{name: n}
			s.eng.selfSeed = nameSeed(n)
			s.connected.Store(true)
			s.eng.peers = map[string]int64{}
			for _, o := range live {
				if o != n {
					s.eng.peers[o] = 1
				}
			}
			s.storeMembersLocked()
			out = append(out, s)
		}
		return out
	}
	owners := func(ss []*Sync, ep string) []string {
		var o []string
		for _, s := range ss {
			if s.Owns(ep) {
				o = append(o, s.name)
			}
		}
		return o
	}
	all := cluster(names)
	before := map[string]string{}
	count := map[string]int{}
	for i := range 1024 {
		ep := fmt.Sprintf("vllm-%d", i)
		o := owners(all, ep)
		if len(o) != 1 {
			t.Fatalf("%s owned by %v, want exactly one", ep, o)
		}
		before[ep] = o[0]
		count[o[0]]++
	}
	for n, c := range count {
		if c < 1024/8*7/10 || c > 1024/8*13/10 {
			t.Fatalf("%s owns %d of 1024, want 128 +-30%%: %v", n, c, count)
		}
	}
	// front-3 leaves.
	left := append(append([]string(nil), names[:3]...), names[4:]...)
	rest := cluster(left)
	for ep, was := range before {
		o := owners(rest, ep)
		if len(o) != 1 {
			t.Fatalf("%s owned by %v after front-3 left", ep, o)
		}
		if was != "front-3" && o[0] != was {
			t.Fatalf("%s moved from %s to %s though its owner stayed", ep, was, o[0])
		}
	}
	// Alone or without NATS, an instance owns everything.
	s := cluster(names[:1])[0]
	if !s.Owns("x") {
		t.Fatal("an instance alone does not own a replica")
	}
	all[0].connected.Store(false)
	if !all[0].Owns(func() string {
		for ep, o := range before {
			if o != "front-0" {
				return ep
			}
		}
		return ""
	}()) {
		t.Fatal("an instance cut from NATS does not scrape every replica")
	}
}

// Over a real NATS server: instances learn each other from the figures
// subject, agree on owners, and an owner's figures reach the others.
func TestSyncSharesEngineFigures(t *testing.T) {
	ns := natstest.Start(t, 0)
	nodes := []*node{startNode(t, ns.URL, "node-a"), startNode(t, ns.URL, "node-b"), startNode(t, ns.URL, "node-c")}
	type got struct {
		ep   string
		l    *fleet.EngineLoad
		next time.Duration
	}
	var mu sync.Mutex
	recv := map[string][]got{}
	for _, n := range nodes {
		name := n.sync.name
		n.sync.OnFigures(func(ep []byte, l *fleet.EngineLoad, next time.Duration) {
			mu.Lock()
			recv[name] = append(recv[name], got{string(ep), l, next})
			mu.Unlock()
		})
	}
	eventually(t, "all connected", func() bool {
		for _, n := range nodes {
			if !n.sync.Connected() {
				return false
			}
		}
		return true
	})
	eventually(t, "each instance knows the two others", func() bool {
		ok := true
		for _, n := range nodes {
			n.sync.eng.mu.Lock()
			n.sync.eng.lastSent = time.Time{} // a heartbeat now
			n.sync.eng.mu.Unlock()
			n.sync.Flush()
			ok = ok && n.sync.Peers() == 2
		}
		return ok
	})
	for _, ep := range []string{"a", "b", "c", "d"} {
		var o []string
		for _, n := range nodes {
			if n.sync.Owns(ep) {
				o = append(o, n.sync.name)
			}
		}
		if len(o) != 1 {
			t.Fatalf("endpoint %s owned by %v, want one", ep, o)
		}
	}
	owner := nodes[0]
	l := &fleet.EngineLoad{Requests: 5, Waiting: 1, KVUsage: 0.3}
	owner.sync.Publish("a", l, 250*time.Millisecond)
	owner.sync.Flush()
	eventually(t, "the figures reach both peers", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(recv["node-b"]) == 1 && len(recv["node-c"]) == 1
	})
	mu.Lock()
	defer mu.Unlock()
	for _, name := range []string{"node-b", "node-c"} {
		g := recv[name][0]
		if g.ep != "a" || !reflect.DeepEqual(g.l, l) || g.next != 250*time.Millisecond {
			t.Fatalf("%s received %+v", name, g)
		}
	}
	if len(recv["node-a"]) != 0 {
		t.Fatalf("the owner received its own figures: %+v", recv["node-a"])
	}
	if m := metric(owner, `turnout_cluster_engine_figures_total{direction="out"}`); m != "1" {
		t.Fatalf("owner's figures out %s, want 1", m)
	}
}
