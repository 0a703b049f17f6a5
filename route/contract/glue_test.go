package contract

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// One rule for every glue: the reason's row, else relay a 4xx, else fail mode.
func TestGlueActionFor(t *testing.T) {
	for _, tc := range []struct {
		status int
		reason string
		want   GlueAction
	}{
		{404, "model_not_found", GlueRelay},
		{413, ReasonBodyTooLarge, GlueRelay},
		{400, ReasonClientKVParams, GlueRelay},
		{422, ReasonPrefillRejected, GlueRelay},
		{400, ReasonBadRequest, GlueFailMode},
		{431, ReasonHeaderTooLarge, GlueFailMode},
		{408, ReasonReadTimeout, GlueFailMode},
		{502, ReasonPrefillFailed, GlueRelay},
		{503, ReasonNoPrefillEndpoint, GlueRelay},
		{503, ReasonNoEndpoint, GlueFailMode},
		{503, ReasonOverloaded, GlueFailMode},
		{503, "tokenizer_unavailable", GlueFailMode},
		{500, "", GlueFailMode},
		{0, "", GlueFailMode},
	} {
		if got := GlueActionFor(tc.status, []byte(tc.reason)); got != tc.want {
			t.Errorf("%d %q: %s, want %s", tc.status, tc.reason, got, tc.want)
		}
	}
	if !slices.Equal(UnreadReasons, []string{ReasonHeaderTooLarge, ReasonReadTimeout, ReasonBadRequest}) {
		t.Errorf("UnreadReasons %v", UnreadReasons)
	}
}

// The glue's own errors are OpenAI-style JSON; the fail-closed one has the
// reason token exactly once, for the glue to replace.
func TestGlueErrors(t *testing.T) {
	for _, e := range []GlueError{FailClosedError, DecodeTooLargeError, RefusedError, NotFoundError, UpstreamFailedError, BodyTooLargeError(1 << 20)} {
		var v apiError
		if err := json.Unmarshal([]byte(e.JSON()), &v); err != nil || v.Error.Type != e.Type || v.Error.Message != e.Message {
			t.Errorf("%+v: %s (%v)", e, e.JSON(), err)
		}
		if n := strings.Count(e.JSON(), ReasonToken); (n == 1) != e.ReasonIsToken {
			t.Errorf("%+v: %d reason tokens", e, n)
		}
		if w := e.JSONWith("$r"); e.ReasonIsToken != strings.Contains(w, `"code":"$r"`) {
			t.Errorf("%+v: JSONWith gives %s", e, w)
		}
	}
	seen := map[string]bool{}
	for _, f := range verdictFields {
		if seen[f.Name] || (f.Header == "" && f.SPOEVar == "") {
			t.Errorf("field %q: duplicate or carried by no transport", f.Name)
		}
		seen[f.Name] = true
	}
}
