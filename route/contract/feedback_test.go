package contract

import (
	"strings"
	"testing"

	"github.com/turnout/turnout/internal/config"
)

// Both log formats come from the one table: every Read field in both, the
// token only when configured, each key once.
func TestFeedbackFormat(t *testing.T) {
	for _, tok := range []string{"", "s3cret-token-0123456789"} {
		cfg := &config.Config{}
		cfg.Feedback.Token = tok
		for name, expr := range map[string]func(FeedbackField) string{
			"haproxy": func(f FeedbackField) string { return f.HAProxy },
			"nginx":   func(f FeedbackField) string { return f.Nginx },
		} {
			line := FeedbackFormat(cfg, expr)
			if !strings.HasPrefix(line, FeedbackTag+" ") {
				t.Errorf("%s: %q does not start with the tag", name, line)
			}
			seen := map[string]bool{}
			for _, kv := range strings.Fields(line)[1:] {
				k, v, ok := strings.Cut(kv, "=")
				if !ok || v == "" || seen[k] {
					t.Errorf("%s: bad or repeated field %q in %q", name, kv, line)
				}
				seen[k] = true
			}
			for _, f := range FeedbackLineFields() {
				if f.Read && !seen[f.Key] && !(f.Token && tok == "") {
					t.Errorf("%s: %q lacks the read field %s", name, line, f.Key)
				}
			}
			if seen[FeedbackFieldToken] != (tok != "") || (tok != "" && !strings.Contains(line, FeedbackAuthField(cfg))) {
				t.Errorf("%s with token %q: %q", name, tok, line)
			}
		}
	}
}

// proxy.first_token_timing off renders no timer, so the line leaves tft=
// out rather than carry a variable nothing sets.
func TestFeedbackFormatFirstTokenOff(t *testing.T) {
	off := false
	for _, timed := range []*bool{nil, &off} {
		cfg := &config.Config{}
		cfg.Proxy.FirstTokenTiming = timed
		for name, expr := range map[string]func(FeedbackField) string{
			"haproxy": func(f FeedbackField) string { return f.HAProxy },
			"nginx":   func(f FeedbackField) string { return f.Nginx },
		} {
			line := FeedbackFormat(cfg, expr)
			if has := strings.Contains(line, " "+FeedbackFieldFirstToken+"="); has != (timed == nil) {
				t.Errorf("%s, timing %v: %q", name, timed == nil, line)
			}
		}
	}
}

// What every glue strips covers every header turnout answers with (but
// Retry-After, a standard header) and every input the glue gives turnout;
// turnout's own paths are under PathInternal.
func TestClientStripCoversContract(t *testing.T) {
	cs := ClientStrip(&config.Config{})
	covered := func(h string) bool {
		for _, p := range cs.Prefixes {
			if strings.HasPrefix(strings.ToLower(h), strings.ToLower(p)) {
				return true
			}
		}
		for _, n := range cs.Names {
			if strings.EqualFold(h, n) {
				return true
			}
		}
		return false
	}
	for _, f := range verdictFields {
		if f.Header != "" && f.Header != HdrRetryAfter && !covered(f.Header) {
			t.Errorf("verdict header %s is not stripped from client requests", f.Header)
		}
	}
	for _, h := range []string{HdrOriginalURI, HdrOriginalMethod, HdrBodyTruncated, HdrToken} {
		if !covered(h) {
			t.Errorf("glue input %s is not stripped from client requests", h)
		}
	}
	if covered("X-Session-Id") || covered("Content-Type") {
		t.Error("the strip list covers client headers")
	}
	for _, p := range []string{PathRoute, PathDone} {
		if !strings.HasPrefix(p, PathInternal) {
			t.Errorf("%s is not under %s", p, PathInternal)
		}
	}
}
