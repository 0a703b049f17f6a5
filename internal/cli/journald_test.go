package cli

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// TestJournaldPrefixes: with the journald format every line starts with the
// syslog priority of its level and the rest is the JSON object.
func TestJournaldPrefixes(t *testing.T) {
	var buf bytes.Buffer
	log := NewLogger(LogWriter(&buf, "journald"), "debug", HumanOutput(&buf, "journald"))
	log.Debug().Msg("d")
	log.Info().Msg("i")
	log.Warn().Msg("w")
	log.Error().Msg("e")
	want := []string{"<7>", "<6>", "<4>", "<3>"}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != len(want) {
		t.Fatalf("got %d lines: %q", len(lines), buf.String())
	}
	for i, l := range lines {
		if !strings.HasPrefix(l, want[i]) {
			t.Errorf("line %d = %q, want prefix %s", i, l, want[i])
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(strings.TrimPrefix(l, want[i])), &m); err != nil {
			t.Errorf("line %d after the prefix is not JSON: %v", i, err)
		}
	}
	var plain bytes.Buffer
	NewLogger(LogWriter(&plain, "json"), "info", false).Warn().Msg("w")
	if strings.HasPrefix(plain.String(), "<") {
		t.Errorf("json format got a prefix: %q", plain.String())
	}
}
