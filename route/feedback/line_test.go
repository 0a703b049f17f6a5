package feedback

import (
	"fmt"
	"testing"

	"github.com/turnout/turnout/route/contract"
)

// The feedback line as the HAProxy and nginx log formats write it, and
// what the reader makes of the pieces it must tolerate.
func TestParseFeedbackLine(t *testing.T) {
	type want struct {
		id, srv, tok          string
		hasID, hasSrv, hasTok bool
		status, ms, ttfb, tft int64
	}
	for _, tc := range []struct {
		name, line string
		ok         bool
		want       want
	}{
		{"haproxy", "<134>Nov 21 10:00:00 haproxy[1]: turnout-done id=00ff srv=b status=200 ms=1234 ttfb=12 tft=345 tok=t0k be=llama_mixed tw=0 tc=0 retries=0",
			true, want{id: "00ff", srv: "b", tok: "t0k", hasID: true, hasSrv: true, hasTok: true, status: 200, ms: 1234, ttfb: 12, tft: 345}},
		{"nginx, quoted, any order, no token", `<190>nginx: turnout-done ttfb="0.012" tft="301" pool=p ms="87" status=502 srv="d1" id="abc"`,
			true, want{id: "abc", srv: "d1", hasID: true, hasSrv: true, status: 502, ms: 87, ttfb: -1, tft: 301}},
		{"unknowns as - and -1", "turnout-done id=- srv= status=- ms=-1 ttfb=- tft=-",
			true, want{id: "-", hasID: true, hasSrv: true, status: -1, ms: -1, ttfb: -1, tft: -1}},
		{"pieces without key, doubled spaces", "turnout-done  =x novalue id=7  ms=16 ms2=3",
			true, want{id: "7", hasID: true, status: -1, ms: 16, ttfb: -1, tft: -1}},
		{"number too long", "turnout-done id=1 ms=1234567890123456",
			true, want{id: "1", hasID: true, status: -1, ms: -1, ttfb: -1, tft: -1}},
		{"tag only", "turnout-done ", true, want{status: -1, ms: -1, ttfb: -1, tft: -1}},
		{"no tag", "haproxy: GET / 200", false, want{}},
		{"tag without the space", "turnout-done", false, want{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, ok := parseFeedbackLine([]byte(tc.line))
			got := want{string(f.id), string(f.srv), string(f.tok), f.hasID, f.hasSrv, f.hasTok, f.status, f.ms, f.ttfb, f.tft}
			if ok != tc.ok || (ok && got != tc.want) {
				t.Fatalf("ok %v %+v, want ok %v %+v", ok, got, tc.ok, tc.want)
			}
		})
	}
}

func TestParseFeedbackLineAllocs(t *testing.T) {
	line := []byte(fmt.Sprintf("<134>haproxy[1]: %s %s=00ff %s=b %s=200 %s=1234 %s=12 %s=t0k be=x",
		contract.FeedbackTag, contract.FeedbackFieldID, contract.FeedbackFieldServer, contract.FeedbackFieldStatus, contract.FeedbackFieldMs, contract.FeedbackFieldTTFB, contract.FeedbackFieldToken))
	var f feedbackFields
	if n := testing.AllocsPerRun(100, func() { f, _ = parseFeedbackLine(line) }); n != 0 || f.ms != 1234 {
		t.Fatalf("%v allocations, ms %d", n, f.ms)
	}
}
