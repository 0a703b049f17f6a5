package nginx

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/contract"
)

// TestAskForwardsContractHeaders: every call nginx makes to turnout carries
// exactly contract.ForwardedHeaders (the HAProxy glue's list), so the
// Authorization header reaches turnout only when a deployment is
// prefill/decode, as with the Lua and SPOE.
func TestAskForwardsContractHeaders(t *testing.T) {
	// The request id travels as the client's, else nginx's own.
	ask := regexp.MustCompile(`proxy_set_header ([A-Za-z0-9_-]+) \$(?:http_[a-z0-9_]+|turnout_request_id);`)
	for _, y := range [][]byte{config.DefaultConfigYAML, []byte(multiYAML), []byte(headerYAML)} {
		cfg := mustParse(t, y)
		out, err := Render(cfg, RenderOptions{Dir: goldenDir})
		if err != nil {
			t.Fatal(err)
		}
		var want []string
		for _, h := range contract.ForwardedHeaders(cfg) {
			want = append(want, strings.ToLower(h.Name))
		}
		// Each "ask" block (one per mode) lists the headers in order.
		blocks := strings.Split(string(out.Config), "proxy_pass_request_headers off;")[1:]
		if len(blocks) == 0 {
			t.Fatal("no call to turnout rendered")
		}
		for i, b := range blocks {
			b, _, _ = strings.Cut(b, "proxy_pass ")
			var got []string
			for _, m := range ask.FindAllStringSubmatch(b, -1) {
				got = append(got, strings.ToLower(m[1]))
			}
			if !slices.Equal(got, want) {
				t.Errorf("call %d forwards %v, want contract.ForwardedHeaders %v", i, got, want)
			}
		}
	}
}
