package route

import (
	"errors"
	"math"
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/turnout/turnout/internal/config"

	"github.com/turnout/turnout/route/fleet"
	"github.com/turnout/turnout/route/kv"
	"github.com/turnout/turnout/route/payload"
	"github.com/turnout/turnout/route/tokenize"
)

func TestKVBindConfig(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	bind := "tcp://" + l.Addr().String()
	_ = l.Close()
	s := mustServer(t, `
health: {disable: true}
kv_events_bind: `+bind+`
deployments:
  - name: llama
    policy: {name: kv-aware, params: {block_size: 4}}
    pools:
      - role: mixed
        endpoints:
          - {name: a, address: 127.0.0.1:8001}
          - {name: b, address: 127.0.0.1:8002, kv_topic: "engine-b"}
          - {name: c, address: 127.0.0.1:8003, kv_events: "tcp://127.0.0.1:5557"}
  - name: other
    kv_events_topic: "kv@{name}@{model}"
    policy: {name: kv-aware, params: {block_size: 4}}
    pools:
      - role: mixed
        endpoints:
          - {name: d, address: 127.0.0.1:8004}
`)
	defer s.Close()
	eps := map[string]*fleet.Endpoint{}
	for _, p := range s.Snapshot().Pools() {
		for _, e := range p.Endpoints {
			eps[e.Name] = e
		}
	}
	for _, tc := range []struct {
		ep, bind, match, miss string
	}{
		{"a", bind, "kv@127.0.0.1:8001@llama-3", "kv@127.0.0.1:8002@llama-3"},
		{"b", bind, "engine-b", "kv@127.0.0.1:8002@x"},
		{"c", "", "", ""}, // dials its own publisher
		{"d", bind, "kv@d@anything", "kv@127.0.0.1:8004@x"},
	} {
		e := eps[tc.ep]
		if e.KVBind != tc.bind {
			t.Fatalf("%s: bind %q, want %q", tc.ep, e.KVBind, tc.bind)
		}
		if tc.match != "" && (!e.KVPattern.Match([]byte(tc.match)) || e.KVPattern.Match([]byte(tc.miss))) {
			t.Fatalf("%s: pattern %s vs %q / %q", tc.ep, e.KVPattern, tc.match, tc.miss)
		}
	}
	if got := s.kvHub.Stats(); len(got) != 1 {
		t.Fatalf("want one bound socket shared by both deployments, have %v", got)
	}

	for _, tc := range []struct{ name, y, want string }{
		{"bad scheme", "kv_events_bind: 127.0.0.1:5557\n", "kv_events_bind"},
		{"bad template", "kv_events_bind: tcp://127.0.0.1:5557\nkv_events_topic: \"kv@{pod}\"\n", "kv_events_topic"},
		{"duplicate topic", "kv_events_bind: tcp://127.0.0.1:5557\nkv_events_topic: same\n", "could not be told apart"},
	} {
		_, err := config.ParseConfig([]byte(tc.y + `
deployments:
  - name: x
    pools: [{role: mixed, endpoints: [{name: a, address: "127.0.0.1:1"}, {name: b, address: "127.0.0.1:2"}]}]
`))
		if !errors.Is(err, config.ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%s: %v, want an error about %s", tc.name, err, tc.want)
		}
	}
}

// TestTokenIDsOnePath: token-id prompts and /tokenize answers take the same
// range as KV events (kv.TokenID), so ids >= 2^31 hash identically on
// both sides and out-of-range ids are refused rather than wrapped.
func TestTokenIDsOnePath(t *testing.T) {
	big := []uint32{0, 1 << 31, math.MaxUint32, 7}
	for _, raw := range []string{`[0,2147483648,4294967295,7]`, `[ 0 , 2147483648, 4294967295 ,7 ]`} {
		got, ok := tokenize.TokenList([]byte(raw), nil)
		if !ok || !slices.Equal(got, big) {
			t.Fatalf("TokenList(%s) = %v %v", raw, got, ok)
		}
		got, ok = bodyIndex(`{"prompt":` + raw + `}`).TokenIDs()
		if !ok || !slices.Equal(got, big) {
			t.Fatalf("TokenIDs(%s) = %v %v", raw, got, ok)
		}
	}
	for _, raw := range []string{`[4294967296]`, `[-1]`, `[1.5]`, `[99999999999999999999999]`} {
		if got, ok := tokenize.TokenList([]byte(raw), nil); ok {
			t.Fatalf("TokenList(%s) accepted %v", raw, got)
		}
		if got, ok := bodyIndex(`{"prompt":` + raw + `}`).TokenIDs(); ok {
			t.Fatalf("TokenIDs(%s) accepted %v", raw, got)
		}
	}
	// The event path yields the same keys for the same ids.
	b, err := kv.EncodeBatch(kv.Batch{Events: []kv.Event{{Kind: kv.EventBlockStored, BlockHashes: []uint64{1, 2}, TokenIDs: big, BlockSize: 2}}}, false)
	if err != nil {
		t.Fatal(err)
	}
	dec, err := kv.DecodeBatch(b)
	if err != nil || !slices.Equal(kv.BlockKeys(dec.Events[0].TokenIDs, 2, nil), kv.BlockKeys(big, 2, nil)) {
		t.Fatalf("event path disagrees: %v %+v", err, dec)
	}
}

// bodyIndex indexes a request body as a decision does.
func bodyIndex(body string) *payload.Index {
	var x payload.Index
	x.Build([]byte(body), false)
	return &x
}
