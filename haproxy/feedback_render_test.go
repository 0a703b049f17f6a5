package haproxy

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/turnout/turnout/route/contract"
)

// The feedback line carries ttfb= and, with feedback.token, the token, in
// the form route.FeedbackLine reads; the result passes haproxy -c.
func TestRenderFeedbackToken(t *testing.T) {
	const tok = "s3cret-token-0123456789"
	cfg := mustParse(t, []byte(`
feedback: {syslog: 127.0.0.1:9514, token: `+tok+`}
deployments: [{name: llama, pools: [{endpoints: [{name: a, address: 127.0.0.1:8001}]}]}]
`))
	out, err := Render(cfg, RenderOptions{Dir: goldenDir})
	if err != nil {
		t.Fatal(err)
	}
	conf := string(out.Config)
	want := contract.FeedbackFieldTTFB + "=%Tr " + contract.FeedbackFieldFirstToken + "=%[var(" + contract.FirstTokenHAProxyVar + ")] " + contract.FeedbackAuthField(cfg) + " "
	if !strings.Contains(conf, want) {
		t.Fatalf("log-format lacks %q:\n%s", want, conf)
	}
	if bin, err := exec.LookPath("haproxy"); err == nil {
		r, err := NewRenderer(nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Check(context.Background(), bin, cfg, RenderOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}
