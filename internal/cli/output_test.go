package cli

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/turnout/turnout/internal/config"
)

// One config problem is reported in the same JSON shape as several: one
// "config problem" event per problem (file, line, field, problem), then the
// command's error.
func TestReportErrorSameShape(t *testing.T) {
	for _, n := range []int{1, 3} {
		ce := &config.ConfigError{File: "t.yaml"}
		for i := 0; i < n; i++ {
			ce.Problems = append(ce.Problems, &config.FieldError{Path: "fallbacks", Line: i + 1, Msg: "out of range"})
		}
		var out bytes.Buffer
		log := NewLogger(&out, "info", false)
		ReportError(&out, log, false, "turnout serve", ce)
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if len(lines) != n+1 {
			t.Fatalf("%d problems: %d lines:\n%s", n, len(lines), out.String())
		}
		for i, l := range lines[:n] {
			var ev map[string]any
			if err := json.Unmarshal([]byte(l), &ev); err != nil {
				t.Fatal(err)
			}
			if ev["message"] != "config problem" || ev["file"] != "t.yaml" || ev["field"] != "fallbacks" || ev["line"] != float64(i+1) || ev["problem"] != "out of range" {
				t.Errorf("%d problems, event %d: %s", n, i, l)
			}
		}
	}
}
