package fleet

import (
	"testing"

	"github.com/turnout/turnout/internal/kvtopic"
)

// A signal is fed when one producer it needs is on; the decisions are
// always on; Unfed keeps exactly the others.
func TestFeeds(t *testing.T) {
	for _, tc := range []struct {
		s   Signal
		on  Producers
		by  Producers
		fed bool
	}{
		{SignalLoad, 0, Of(ProducerDecisions), false},
		{SignalLoad, Of(ProducerFeedback), Of(ProducerDecisions, ProducerFeedback), true},
		{SignalLoad, Of(ProducerEngineMetrics, ProducerCluster), Of(ProducerDecisions, ProducerEngineMetrics, ProducerCluster), true},
		{SignalAvailable, 0, 0, true},
		{SignalAvailable, Of(ProducerHealth, ProducerEngineMetrics), Of(ProducerHealth), true},
		{SignalKVEvents, Of(ProducerEngineMetrics), 0, false},
		{SignalKVEvents, Of(ProducerKVEvents), Of(ProducerKVEvents), true},
		{SignalFirstToken, Of(ProducerFeedback), 0, false},
	} {
		by, fed := Feeds(tc.s, tc.on)
		if by != tc.by || fed != tc.fed {
			t.Errorf("Feeds(%s, %s) = %s, %v; want %s, %v", tc.s, tc.on, by, fed, tc.by, tc.fed)
		}
	}
	want := SignalSet(SignalLoad, SignalKVEvents, SignalFirstToken, SignalAvailable)
	if got := Unfed(want, Of(ProducerFeedback)); got != SignalSet(SignalKVEvents, SignalFirstToken) {
		t.Errorf("Unfed = %s", got)
	}
	if got := SignalSet(SignalKVEvents, SignalLoad).String(); got != "load,kv_events" {
		t.Errorf("String = %q", got)
	}
}

// The accessors read the last published scrape, and nothing before one.
func TestEngineAccessors(t *testing.T) {
	e := &Endpoint{Name: "a", State: &State{}}
	if _, ok := e.EngineRequests(); ok || e.KVBlockSize() != 0 || e.EngineTTFT().Known() || e.EngineTTFT().Count() != 0 {
		t.Fatal("figures before any scrape")
	}
	e.SetEngineLoad(&EngineLoad{Requests: 5, BlockSize: 16, TTFTSeconds: 2.5, TTFTCount: 10})
	h := e.EngineTTFT()
	if n, ok := e.EngineRequests(); !ok || n != 5 || e.KVBlockSize() != 16 || !h.Known() || h.Seconds() != 2.5 || h.Count() != 10 {
		t.Fatalf("after a scrape: %v %v %d %v", n, ok, e.KVBlockSize(), h)
	}
	if e.EngineTTFT() != h {
		t.Error("two reads of one scrape differ")
	}
	e.SetEngineLoad(&EngineLoad{Requests: 5, BlockSize: 16, TTFTSeconds: 2.5, TTFTCount: 10})
	if e.EngineTTFT() == h {
		t.Error("a new scrape with the same figures reads equal")
	}
}

func TestKVSource(t *testing.T) {
	pat, err := kvtopic.Compile(kvtopic.DefaultTemplate, "b", "127.0.0.1:8000")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		e    Endpoint
		ok   bool
		want string
	}{
		{Endpoint{Name: "a"}, false, ""},
		{Endpoint{Name: "a", KVEvents: "tcp://x:1", KVTopic: "t", KVReplay: "tcp://x:2"}, true, "tcp://x:1"},
		{Endpoint{Name: "b", KVBind: "tcp://0.0.0.0:5557", KVPattern: pat}, true, ""},
	} {
		src, ok := tc.e.KVSource()
		if ok != tc.ok || src.Address != tc.want || (ok && src.Name != tc.e.Name) || src.Bind != tc.e.KVBind || src.ReplayAddress != tc.e.KVReplay {
			t.Errorf("%+v: KVSource = %+v, %v", tc.e, src, ok)
		}
	}
}
