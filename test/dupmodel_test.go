//go:build e2e

package e2e

import (
	"encoding/json"
	"strings"
	"testing"
)

// dupBody is a ~60 KB chat body whose second "model" key lies past
// route_body (48 KiB): vLLM serves the last key.
func dupBody(first, last string) []byte {
	b, _ := json.Marshal(map[string]any{"messages": []map[string]string{{"role": "user", "content": strings.Repeat("lorem ipsum ", 5000)}}})
	return []byte(`{"model":"` + first + `",` + string(b[1:len(b)-1]) + `,"model":"` + last + `"}`)
}

// One reading of the model whatever the body size, through every glue that
// sends turnout a body: with two deployments a body naming both (the
// second past route_body) is refused with 400 duplicate_model, not routed
// on the first, and a body whose only "model" lies past route_body is
// routed by it. (One deployment reading the last key: route's
// TestDuplicateModelRefused.)
func TestDuplicateModelPastRouteBody(t *testing.T) {
	two := func(p string) []depSpec {
		return []depSpec{
			{name: p + "a", policy: policyLeast, mocks: mocks(t, p+"a", 1, nil)},
			{name: p + "b", policy: policyLeast, mocks: mocks(t, p+"b", 1, nil)},
		}
	}
	for _, path := range []string{"spoe", "lua", "nginx"} {
		t.Run(path, func(t *testing.T) {
			p := "dm" + path[:1]
			var f frontend
			switch path {
			case "nginx":
				ds := two(p)
				f = (&nstack{failMode: "open", deps: []ndep{
					{name: ds[0].name, policy: policyLeast, mode: "body", mocks: ds[0].mocks},
					{name: ds[1].name, policy: policyLeast, mode: "body", mocks: ds[1].mocks},
				}}).start(t)
			case "spoe":
				f = startStackWith(t, "open", spoeDefault, two(p)...)
			default:
				f = startStackWith(t, "open", "", two(p)...)
			}
			body := dupBody(p+"a", p+"b")
			if len(body) < 58<<10 || strings.Index(string(body), `"model":"`+p+`b"`) < 48<<10 {
				t.Fatalf("the body (%d bytes) does not put its second model past route_body", len(body))
			}
			r := f.post(t, "/v1/chat/completions", body, nil)
			if r.Status != 400 || !strings.Contains(string(r.Body), "duplicate_model") || r.Header.Get("X-Replica") != "" {
				t.Fatalf("two models, the second past route_body: %d %q from %q, want turnout's 400 duplicate_model", r.Status, r.Body, r.Header.Get("X-Replica"))
			}
			// Its only "model" past route_body: routed by it, not refused as modelless.
			one := []byte(strings.Replace(string(body), `{"model":"`+p+`a",`, `{`, 1))
			if r := f.post(t, "/v1/chat/completions", one, nil); r.Status != 200 || r.Header.Get("X-Replica") != p+"b-0" {
				t.Fatalf("one model past route_body: %d from %q, want %sb-0", r.Status, r.Header.Get("X-Replica"), p)
			}
		})
	}
}
