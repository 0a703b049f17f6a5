package config

import (
	"errors"
	"strings"
	"testing"
)

// The request_log section: defaults, and each bad value named with its
// field and line, all at once.
func TestRequestLogConfig(t *testing.T) {
	c := mustParse(t, "deployments:\n  - name: a\n    pools: [{endpoints: [{name: a, address: 127.0.0.1:1}]}]\n")
	if r := c.RequestLog; r.On() || r.To != RequestLogStdout || r.MaxSizeMB != 100 || r.MaxBackups != 5 {
		t.Errorf("defaults: %+v", r)
	}
	c = mustParse(t, "request_log: {sample: 0.5, to: syslog, syslog: 'udp://127.0.0.1:514'}\ndeployments:\n  - name: a\n    pools: [{endpoints: [{name: a, address: 127.0.0.1:1}]}]\n")
	if n, a := c.RequestLog.SyslogTarget(); !c.RequestLog.On() || n != "udp" || a != "127.0.0.1:514" {
		t.Errorf("syslog: %+v", c.RequestLog)
	}

	_, err := ParseConfig([]byte(`request_log:
  sample: 1.5
  to: kafka
  max_size_mb: -1
  syslog: 'http://x'
deployments:
  - name: a
    pools: [{endpoints: [{name: a, address: 127.0.0.1:1}]}]
`))
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v", err)
	}
	want := map[string]int{"request_log.sample": 2, "request_log.to": 3, "request_log.max_size_mb": 4, "request_log.syslog": 5}
	got := map[string]int{}
	for _, p := range ce.Problems {
		got[p.Path] = p.Line
	}
	for f, line := range want {
		if got[f] != line {
			t.Errorf("%s: line %d, want %d (%v)", f, got[f], line, err)
		}
	}
	_, err = ParseConfig([]byte("request_log: {sample: 1, to: file}\ndeployments:\n  - name: a\n    pools: [{endpoints: [{name: a, address: 127.0.0.1:1}]}]\n"))
	if err == nil || !strings.Contains(err.Error(), "request_log.file") || !strings.Contains(err.Error(), "required with to: file") {
		t.Errorf("to: file without a file: %v", err)
	}
}
