package feedback

import (
	"bytes"

	"github.com/turnout/turnout/route/contract"
)

// The feedback line (the table of route/contract/feedback.go; the HAProxy and
// nginx log formats write it): parsed here as a pure function over the
// line's bytes, without a Decider, so the format's reader lives in one
// place. FeedbackLine (feedback.go) acts on what it finds.

// feedbackFields are the parsed fields of one line (views into it).
type feedbackFields struct {
	id, srv, tok, up, term []byte
	hasID, hasSrv, hasTok  bool
	status, ms, ttfb, tft  int64 // -1 = absent or unknown
	retries                int64
}

// parseFeedbackLine reads the key=value fields after contract.FeedbackTag in line
// (any syslog header before it); ok is false without the tag. It does not
// allocate.
func parseFeedbackLine(line []byte) (f feedbackFields, ok bool) {
	i := bytes.Index(line, []byte(contract.FeedbackTag+" "))
	if i < 0 {
		return f, false
	}
	return parseFeedback(line[i+len(contract.FeedbackTag)+1:]), true
}

// parseFeedback reads space-separated key=value fields in any order;
// unknown keys and pieces without a key are skipped, values may be quoted.
func parseFeedback(rest []byte) (f feedbackFields) {
	f.status, f.ms, f.ttfb, f.tft, f.retries = -1, -1, -1, -1, -1
	for len(rest) > 0 {
		var kv []byte
		if j := bytes.IndexByte(rest, ' '); j >= 0 {
			kv, rest = rest[:j], rest[j+1:]
		} else {
			kv, rest = rest, nil
		}
		eq := bytes.IndexByte(kv, '=')
		if eq <= 0 {
			continue
		}
		k, v := kv[:eq], bytes.Trim(kv[eq+1:], "\"")
		switch string(k) { // no allocation: the compiler compares in place
		case contract.FeedbackFieldID:
			f.id, f.hasID = v, true
		case contract.FeedbackFieldServer:
			f.srv, f.hasSrv = v, true
		case contract.FeedbackFieldStatus:
			f.status = parseMs(v)
		case contract.FeedbackFieldMs:
			f.ms = parseMs(v)
		case contract.FeedbackFieldTTFB:
			f.ttfb = parseMs(v)
		case contract.FeedbackFieldFirstToken:
			f.tft = parseMs(v)
		case contract.FeedbackFieldRetries:
			// "+1": the retry redispatched to another server.
			f.retries = parseMs(bytes.TrimPrefix(v, []byte("+")))
		case contract.FeedbackFieldUpstream:
			f.up = v
		case contract.FeedbackFieldToken:
			f.tok, f.hasTok = v, true
		case contract.FeedbackFieldTerm:
			f.term = v
		}
	}
	return f
}

// parseMs reads a non-negative decimal; anything else ("-", "-1", "") is -1.
func parseMs(b []byte) int64 {
	if len(b) == 0 || len(b) > 15 {
		return -1
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return -1
		}
		n = n*10 + int64(c-'0')
	}
	return n
}
