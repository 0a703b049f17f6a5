package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"k8s.io/klog/v2"
)

// TestRouteKlogWritesJSON: a klog line (as client-go's reflector writes
// them) comes out as one zerolog JSON object with klog's message, level
// and key/values, not klog's "W1125 ..." text.
func TestRouteKlogWritesJSON(t *testing.T) {
	var buf bytes.Buffer
	RouteKlog(NewLogger(&buf, "info", false))
	t.Cleanup(klog.ClearLogger)
	klog.InfoS("watch of *v1.EndpointSlice ended", "reason", "too old resource version")
	klog.ErrorS(errors.New("connection refused"), "failed to list", "resource", "endpointslices")
	klog.Flush()
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 JSON lines, got %d: %q", len(lines), buf.String())
	}
	want := []map[string]string{
		{"level": "info", "message": "watch of *v1.EndpointSlice ended", "reason": "too old resource version", "logger": "klog"},
		{"level": "error", "message": "failed to list", "resource": "endpointslices", "error": "connection refused", "logger": "klog"},
	}
	for i, line := range lines {
		var got map[string]any
		if err := json.Unmarshal([]byte(line), &got); err != nil {
			t.Fatalf("line %d is not JSON (%v): %s", i, err, line)
		}
		for k, v := range want[i] {
			if got[k] != v {
				t.Errorf("line %d: %s = %v, want %q (line %s)", i, k, got[k], v, line)
			}
		}
		if _, ok := got["time"]; !ok {
			t.Errorf("line %d has no time: %s", i, line)
		}
	}
}
