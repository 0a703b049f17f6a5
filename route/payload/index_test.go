package payload

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
)

// refCompare fails unless the one-pass Index answers every question the
// way the per-question reference scanners did. It holds for JSON and any
// prefix of it (a cut body); on other garbage both scanners are lenient in
// different ways (refIsObject counts brackets, Build reads members; a
// prompt field after a malformed one is not walked), so FuzzIndex compares
// only valid bodies and their prefixes.
func refCompare(t *testing.T, b []byte) {
	t.Helper()
	livePrompt(t, b)
	var x Index
	x.Build(b, false)
	if got, want := x.ModelRaw(), refFindModel(b); !bytes.Equal(got, want) {
		t.Fatalf("%q: ModelRaw %q, reference %q", b, got, want)
	}
	if json.Valid(b) {
		if want := bytes.HasPrefix(bytes.TrimLeft(b, " \t\r\n"), []byte("{")); x.Object() != want || refIsObject(b) != want {
			t.Fatalf("%q: Object %v, reference %v, want %v", b, x.Object(), refIsObject(b), want)
		}
		for _, k := range []string{KVTransferKey, "stream", "model", "messages", "prompt"} {
			if x.Has(k) != refHasKey(b, k) {
				t.Fatalf("%q: Has(%s) = %v", b, k, x.Has(k))
			}
			if got, want := x.Value(k), TopValue(b, k); !bytes.Equal(got, want) {
				t.Fatalf("%q: Value(%s) = %q, TopValue %q", b, k, got, want)
			}
		}
	}
	if x.promptStop {
		return
	}
	var got recSink
	var want refRec
	gf, wf := x.Prompt(&got), refWalkPrompt(b, &want)
	if gf != wf || got.b.String() != want.b.String() {
		t.Fatalf("%q: Prompt %q (%v), reference %q (%v)", b, got.b.String(), gf, want.b.String(), wf)
	}
	gt, gok := x.TokenIDs()
	wt, wok := refTokenPrompt(b, nil)
	var w32 []uint32
	for _, v := range wt {
		if v < 0 || v > math.MaxUint32 {
			wok = false // out of kv.TokenID's range: refused
		}
		w32 = append(w32, uint32(v))
	}
	if gok != wok || (gok && !slices.Equal(gt, w32)) {
		t.Fatalf("%q: TokenIDs %v %v, reference %v %v", b, gt, gok, wt, wok)
	}
}

// livePrompt checks the two ways Prompt gives the prompt: asked first (as
// a decision does), the rest of the pass feeds the sink as it reads; asked
// again, the recorded pieces are replayed. Both must be the reference's
// stream, byte for byte (separators and token ids as a hasher sees them).
func livePrompt(t *testing.T, b []byte) {
	t.Helper()
	var x Index
	x.Build(b, false)
	var live, replay, want byteSink
	lf := x.Prompt(&live)
	rf := x.Prompt(&replay)
	if x.Scans() != 1 {
		t.Fatalf("%q: %d scans", b, x.Scans())
	}
	if x.promptStop {
		return // the reference walker stops elsewhere on a malformed prompt
	}
	wf := refWalkPrompt(b, &want)
	if lf != wf || rf != wf || !bytes.Equal(live.b, want.b) || !bytes.Equal(replay.b, want.b) {
		t.Fatalf("%q: live %q (%v), replayed %q (%v), reference %q (%v)", b, live.b, lf, replay.b, rf, want.b, wf)
	}
}

var refBodies = []string{
	`{"model":"llama","messages":[{"role":"user","content":"hi"}],"stream":true}`,
	`{"messages":[{"role":"user","content":"hi \"x\" }"}],"model":"m2"}`,
	`{"model":5,"model":"second"}`,
	`{"x":{"model":"no"},"model":"yes","kv_transfer_params":{"a":1}}`,
	`{"prompt":[1,2,-3],"model":"m"}`,
	`{"prompt":[[1,2],[3]]}`,
	`{"prompt":[[1,"a"]]}`,
	`{"prompt":[1,"a"]}`,
	`{"prompt":["a",1]}`,
	`{"prompt":[1,[2]]}`,
	`{"prompt":[[]]}`,
	`{"prompt":[]}`,
	`{"prompt":[[[1]]]}`,
	`{"prompt":[1.5,2]}`,
	`{"prompt":[1,2`,
	`{"prompt":[[1,2],[3`,
	`{"prompt":[99999999999999999999]}`,
	`{"prompt":[[1,2],[-1]]}`,
	`{"prompt":[[4294967296]]}`,
	`{"prompt":[0,4294967295,-1]}`,
	`{"prompt":"p","prompt":[1,2]}`,
	`{"prompt":[1],"prompt":[2]}`,
	`{"prompt":[1,2],"model":"m","prompt":[3]}`,
	`{"messages":[{"role":"system","content":"s"}],"model":"m","input":[{"role":"user","content":"u"}]}`,
	`{"model":"m","prompt":[[5,6],"t",[7]]}`,
	`{"input":[{"role":"user","content":[{"type":"input_text","text":"Q"}]},"s"]}`,
	`{"messages":[{"role":"user","content":"abc`,
	`{"messages":"plain","stream":false}`,
	` { } `,
	`{}`,
	`{"a":1} x`,
	`[1]`,
	``,
	`{"a" 1}`,
	`{,"a":1,,"b":2}`,
	`{"k\"ey":"v","max_tokens":3}`,
}

func TestIndexMatchesReference(t *testing.T) {
	for _, b := range refBodies {
		refCompare(t, []byte(b))
	}
}

// A prompt of an unexpected shape stops the prompt but not the index: the
// model and the PD keys after it are still read.
func TestIndexMalformedPrompt(t *testing.T) {
	x := index(`{"messages":[1,2],"model":"m","kv_transfer_params":{}}`)
	var r recSink
	if !x.Prompt(&r) || string(x.Model()) != "m" || !x.Has(KVTransferKey) || !x.Object() {
		t.Fatalf("prompt %q model %q kv %v object %v", r.b.String(), x.Model(), x.Has(KVTransferKey), x.Object())
	}
}

func TestIndexShape(t *testing.T) {
	for _, tc := range []struct {
		body          string
		object, empty bool
		open          int
		keys          string
	}{
		{`{"a":1,"b":[2]}`, true, false, 0, "a,b"},
		{" \n{ }\t", true, true, 2, ""},
		{`{"a":1`, false, false, 0, "a"},
		{`{"a":1}]`, false, false, 0, "a"},
		{`"s"`, false, false, -1, ""},
		{`{"a\"b":{"c":1},"d":"e"}`, true, false, 0, `a\"b,d`},
	} {
		x := index(tc.body)
		var keys []string
		for _, m := range x.Members() {
			keys = append(keys, string(x.Raw(m.Key)))
		}
		if x.Object() != tc.object || x.Open() != tc.open || (tc.object && x.empty != tc.empty) || strings.Join(keys, ",") != tc.keys {
			t.Errorf("%q: object %v open %d empty %v keys %q", tc.body, x.Object(), x.Open(), x.empty, keys)
		}
	}
}

func TestModelUnescaped(t *testing.T) {
	for _, tc := range []struct{ body, raw, model string }{
		{`{"model":"meta\/llama"}`, `meta\/llama`, "meta/llama"},
		{`{"model":"plain"}`, "plain", "plain"},
		{`{"model":"bad\q"}`, `bad\q`, `bad\q`},
	} {
		x := index(tc.body)
		if string(x.ModelRaw()) != tc.raw || string(x.Model()) != tc.model {
			t.Errorf("%s: raw %q model %q", tc.body, x.ModelRaw(), x.Model())
		}
	}
}

// A reused Index must forget the last body entirely.
func TestIndexReuse(t *testing.T) {
	var x Index
	x.Build([]byte(`{"model":"a","prompt":[1,2],"kv_transfer_params":{}}`), true)
	x.Reset()
	x.Build([]byte(`{"messages":[{"role":"user","content":"x"}]}`), false)
	var r recSink
	x.Prompt(&r)
	if _, ok := x.TokenIDs(); ok || x.Has(KVTransferKey) || len(x.Model()) > 0 || x.Cut() || r.b.String() != "user|x|" || x.Scans() != 1 {
		t.Fatalf("stale state: model %q prompt %q cut %v scans %d", x.Model(), r.b.String(), x.Cut(), x.Scans())
	}
}

// A warm Index builds and replays without allocating (the decision path's contract).
// Scans counts every Build since Reset: a second pass shows.
func TestIndexScans(t *testing.T) {
	var x Index
	x.Build([]byte(`{}`), false)
	x.Build([]byte(`{}`), false)
	if x.Scans() != 2 {
		t.Fatalf("two builds counted %d", x.Scans())
	}
	x.Reset()
	if x.Scans() != 0 {
		t.Fatalf("reset kept %d scans", x.Scans())
	}
}

func TestIndexAllocs(t *testing.T) {
	body := []byte(`{"model":"m","messages":[{"role":"system","content":"` + strings.Repeat("s", 3000) +
		`"},{"role":"user","content":[{"type":"text","text":"q"}]}],"prompt":[[1,2,3]],"stream":true}`)
	var x Index
	var v viewSink
	v.body = body
	v.t = t
	n := testing.AllocsPerRun(100, func() {
		x.Reset()
		x.Build(body, false)
		v.last = 0
		x.Prompt(&v)
		_, _ = x.TokenIDs()
		_ = x.Has(KVTransferKey)
	})
	if n != 0 {
		t.Fatalf("%v allocations per build", n)
	}
}

func TestPrefillBody(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"chat stream", `{"model":"m","messages":[{"role":"user","content":"héllo ✓ \u00e9"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":200,"temperature":0.70}`,
			`{"model":"m","messages":[{"role":"user","content":"héllo ✓ \u00e9"}],"stream":false,"max_tokens":1,"temperature":0.70,"kv_transfer_params":` + PrefillKV + `}`},
		{"completions no max", `{"model":"m","prompt":[1,2,3],"seed":12345678901234567890}`,
			`{"model":"m","prompt":[1,2,3],"seed":12345678901234567890,"max_tokens":1,"stream":false,"kv_transfer_params":` + PrefillKV + `}`},
		{"max_completion_tokens", `{"max_completion_tokens":99,"messages":[],"n":1e3}`,
			`{"max_completion_tokens":1,"messages":[],"n":1e3,"max_tokens":1,"stream":false,"kv_transfer_params":` + PrefillKV + `}`},
		{"empty object", `{}`, `{"max_tokens":1,"stream":false,"kv_transfer_params":` + PrefillKV + `}`},
		{"whitespace kept inside values", "{ \"model\" : \"m\" , \"x\" : [ 1 , 2 ] }", `{"model":"m","x":[ 1 , 2 ],"max_tokens":1,"stream":false,"kv_transfer_params":` + PrefillKV + `}`},
		{"escaped key", `{"a\"b":1}`, `{"a\"b":1,"max_tokens":1,"stream":false,"kv_transfer_params":` + PrefillKV + `}`},
		{"client kv dropped", `{"kv_transfer_params":{"x":1},"model":"m"}`, `{"model":"m","max_tokens":1,"stream":false,"kv_transfer_params":` + PrefillKV + `}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := PrefillBody(index(tc.in))
			if err != nil || string(got) != tc.want {
				t.Fatalf("PrefillBody:\n got %s (%v)\nwant %s", got, err, tc.want)
			}
			if !json.Valid(got) {
				t.Fatalf("invalid JSON: %s", got)
			}
		})
	}
	for _, bad := range []string{`[1]`, `{"a":1} x`, `{"a":`, `nope`, ``, `{"a" 1}`} {
		if _, err := PrefillBody(index(bad)); err == nil {
			t.Fatalf("PrefillBody(%q) accepted", bad)
		}
	}
}

func TestDecodeBody(t *testing.T) {
	kv := `{"do_remote_prefill":true,"remote_block_ids":[1,2],"remote_engine_id":"e","remote_host":"h","remote_port":5}`
	for _, tc := range []struct{ in, want string }{
		{`{"model":"m","stream":true}`, `{"kv_transfer_params":` + kv + `,"model":"m","stream":true}`},
		{` { } `, ` {"kv_transfer_params":` + kv + ` } `},
		{`{"messages":[{"content":"日本語"}]}`, `{"kv_transfer_params":` + kv + `,"messages":[{"content":"日本語"}]}`},
	} {
		got, err := DecodeBody(index(tc.in), []byte(kv))
		if err != nil || string(got) != tc.want || !json.Valid(got) {
			t.Fatalf("DecodeBody(%s) = %s (%v)", tc.in, got, err)
		}
	}
	for _, bad := range []string{`[1]`, `{"a":1} x`, `{`, ``} {
		if _, err := DecodeBody(index(bad), []byte(kv)); err == nil {
			t.Fatalf("DecodeBody(%q) accepted", bad)
		}
	}
}

func TestAppendInts(t *testing.T) {
	if got, ok := AppendInts(nil, []byte(` [ 0 , 2147483648,-7 ]`)); !ok || !slices.Equal(got, []int64{0, 2147483648, -7}) {
		t.Fatalf("%v %v", got, ok)
	}
	for _, bad := range []string{`[1.5]`, `[1,"a"]`, `{}`, `[1`, `[99999999999999999999]`} {
		if got, ok := AppendInts(nil, []byte(bad)); ok {
			t.Fatalf("AppendInts(%s) accepted %v", bad, got)
		}
	}
	if got := string(AppendString(nil, []byte("a\"\\\n"))); got != `"a\"\\\u000a"` {
		t.Fatalf("AppendString = %s", got)
	}
}

func FuzzIndex(f *testing.F) {
	for _, s := range append(refBodies,
		`{"model":"x","messages":[{"role":"user","content":[{"type":"text","text":"a"}]}]}`,
		`{"input":"x"}`, `{"model":"a\"b"}`, `[`, `{"a":"\`, "{\"prompt\":\"\xff\"}") {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if json.Valid(b) {
			// Every cut of a small body; a sample of a large one's (quadratic).
			step := max(1, len(b)/512)
			for k := 0; k <= len(b); k += step {
				refCompare(t, b[:k])
			}
			refCompare(t, b)
		}
		var x Index
		x.Build(b, false)
		// Every text piece must be a view into the body, in increasing order.
		x.Prompt(&viewSink{body: b, t: t})
		if x.Object() {
			pb, err := PrefillBody(&x)
			if json.Valid(b) {
				if want, werr := refPrefillBody(b); werr != nil || !bytes.Equal(pb, want) {
					t.Fatalf("%q: prefill body %q, reference %q (%v)", b, pb, want, werr)
				}
			}
			var y Index
			y.Build(pb, false)
			if err != nil || !y.Object() {
				t.Fatalf("%q: prefill body %q (%v) is no object", b, pb, err)
			}
			db, err := DecodeBody(&x, []byte(`{"k":1}`))
			y.Build(db, false)
			if err != nil || !y.Object() || !bytes.Equal(y.Value(KVTransferKey), []byte(`{"k":1}`)) {
				t.Fatalf("%q: decode body %q (%v)", b, db, err)
			}
		}
	})
}

// Build reads up to the model; what only some decisions need is read when
// first asked, by resuming the same pass (no byte twice).
func TestBuildStopsAfterModel(t *testing.T) {
	body := `{"model":"m","messages":[{"role":"user","content":"q"}],"kv_transfer_params":{}}`
	x := index(body)
	if string(x.Model()) != "m" || x.done || x.s.i != len(`{"model":"m"`) {
		t.Fatalf("after Build: model %q done %v cursor %d", x.Model(), x.done, x.s.i)
	}
	var r recSink
	if !x.Prompt(&r) || r.b.String() != "user|q|" || !x.done || !x.Object() || !x.Has(KVTransferKey) || x.Scans() != 1 {
		t.Fatalf("resumed: prompt %q done %v object %v scans %d", r.b.String(), x.done, x.Object(), x.Scans())
	}
	// A model after the prompt: the prompt was read on the way to it.
	x = index(`{"prompt":[1,2],"model":"m"}`)
	if len(x.pieces) != 1 || x.pieces[0].end-x.pieces[0].off != 2 || string(x.Model()) != "m" {
		t.Fatalf("model last: %d pieces, model %q", len(x.pieces), x.Model())
	}
}

// summary is everything an Index answers, for comparisons.
func summary(x *Index) string {
	var r recSink
	found := x.Prompt(&r)
	ids, ok := x.TokenIDs()
	var keys []string
	for _, m := range x.Members() {
		keys = append(keys, string(x.Raw(m.Key))+"="+string(x.Raw(m.Value)))
	}
	return fmt.Sprintf("model %q/%q prompt %q %v ids %v %v object %v open %d empty %v cut %v keys %q scans %d",
		x.ModelRaw(), x.Model(), r.b.String(), found, ids, ok, x.Object(), x.Open(), x.empty, x.Cut(), keys, x.Scans())
}

// A reused Index answers exactly as a fresh one, whatever it held before.
func TestIndexReuseTable(t *testing.T) {
	var reused Index
	for i, a := range refBodies {
		b := refBodies[(i*7+3)%len(refBodies)]
		reused.Build([]byte(a), i%2 == 0)
		reused.Prompt(&recSink{}) // finish a's pass
		reused.Reset()
		reused.Build([]byte(b), false)
		if got, want := summary(&reused), summary(index(b)); got != want {
			t.Fatalf("after %q, %q:\n got %s\nwant %s", a, b, got, want)
		}
	}
}
