package nginx

import (
	"context"
	"strings"
	"testing"

	"github.com/turnout/turnout/route/contract"
)

// The feedback line carries ttfb= and, with feedback.token, the token, in
// the form route.FeedbackLine reads; the result passes nginx -t.
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
	want := contract.FeedbackFieldTTFB + "=$turnout_ttfb " + contract.FeedbackFieldFirstToken + "=$" + contract.FirstTokenNginxVar + " " + contract.FeedbackAuthField(cfg) + " "
	if !strings.Contains(string(out.Config), want) {
		t.Fatalf("log_format lacks %q:\n%s", want, out.Config)
	}
	r, err := NewRenderer(nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Check(context.Background(), nginxBin(t), cfg, RenderOptions{}); err != nil {
		t.Fatal(err)
	}
}
