package reqlog

import (
	"bytes"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route"
)

func record() *route.DecisionRecord {
	return &route.DecisionRecord{ID: 0xe53473b0825a1864, Deployment: "llama", Model: "llama", Endpoint: "a", Pool: "llama_mixed",
		Outcome: "affinity", MatchedBlocks: 3, Session: true, Status: 200, TTFBMs: 12, DurationMs: 340, Retries: 0,
		ServedBy: "a", State: "closed", Start: time.Unix(1700000000, 0)}
}

// Each destination gets one JSON line per record with the record's fields.
func TestDestinations(t *testing.T) {
	check := func(t *testing.T, line []byte) {
		t.Helper()
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatalf("not JSON (%v): %q", err, line)
		}
		for k, v := range map[string]any{"decision": "e53473b0825a1864", "endpoint": "a", "outcome": "affinity",
			"matched_blocks": 3.0, "duration_ms": 340.0, "message": "request"} {
			if m[k] != v {
				t.Errorf("%s = %v, want %v: %s", k, m[k], v, line)
			}
		}
	}
	t.Run("stdout", func(t *testing.T) {
		var out, errw bytes.Buffer
		l, err := Open(&config.RequestLogConfig{To: config.RequestLogStdout}, &out, &errw)
		if err != nil {
			t.Fatal(err)
		}
		l.Request(record())
		if errw.Len() != 0 {
			t.Errorf("stderr got %q", errw.String())
		}
		check(t, bytes.TrimSpace(out.Bytes()))
	})
	t.Run("file", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "sub", "requests.log")
		l, err := Open(&config.RequestLogConfig{To: config.RequestLogFile, File: path, MaxSizeMB: 1, MaxBackups: 2}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		l.Request(record())
		l.Request(record())
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) != 2 {
			t.Fatalf("%d lines: %q", len(lines), b)
		}
		check(t, []byte(lines[1]))
	})
	t.Run("syslog", func(t *testing.T) {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		l, err := Open(&config.RequestLogConfig{To: config.RequestLogSyslog, Syslog: "udp://" + pc.LocalAddr().String()}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		l.Request(record())
		buf := make([]byte, 4096)
		_ = pc.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, _, err := pc.ReadFrom(buf)
		if err != nil {
			t.Fatal(err)
		}
		msg := buf[:n]
		// <134> = local0 (16*8) + info (6); the tag; then the JSON line.
		if !bytes.HasPrefix(msg, []byte("<134>")) || !bytes.Contains(msg, []byte("turnout")) {
			t.Errorf("syslog header: %q", msg)
		}
		i := bytes.IndexByte(msg, '{')
		if i < 0 {
			t.Fatalf("no JSON in %q", msg)
		}
		check(t, bytes.TrimSpace(msg[i:]))
	})
}
