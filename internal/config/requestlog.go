package config

import (
	"fmt"
	"net"
	"strings"
)

// RequestLogConfig is the request log (docs/request-log.md): one line per
// completed request, from the proxy's feedback and the decision ledger,
// and one per request turnout refused itself. Off unless Sample > 0.
type RequestLogConfig struct {
	// Sample is the fraction of requests logged: 0 (default) off, 1 every
	// one. Sampled by decision id (random), so a request is logged or not
	// whatever instance or line reads it.
	Sample float64 `yaml:"sample"`
	// To is the destination: stdout (default), stderr, file or syslog.
	To string `yaml:"to"`
	// File is the log file (to: file), rotated at MaxSizeMB, keeping
	// MaxBackups old files for at most MaxAgeDays (0: no age limit).
	File       string `yaml:"file"`
	MaxSizeMB  int    `yaml:"max_size_mb"`
	MaxBackups int    `yaml:"max_backups"`
	MaxAgeDays int    `yaml:"max_age_days"`
	// Syslog is the syslog server (to: syslog): "udp://host:port",
	// "tcp://host:port", or "" for the local syslog daemon's socket.
	Syslog string `yaml:"syslog"`
}

// Request log destinations.
const (
	RequestLogStdout = "stdout"
	RequestLogStderr = "stderr"
	RequestLogFile   = "file"
	RequestLogSyslog = "syslog"
)

// On reports whether requests are logged at all.
func (r *RequestLogConfig) On() bool { return r.Sample > 0 }

// SyslogTarget splits Syslog into the network and address log/syslog
// dials ("", "" for the local daemon).
func (r *RequestLogConfig) SyslogTarget() (network, addr string) {
	if r.Syslog == "" {
		return "", ""
	}
	network, addr, _ = strings.Cut(r.Syslog, "://")
	return network, addr
}

func (c *Config) applyRequestLogDefaults() {
	r := &c.RequestLog
	orDefault(&r.To, RequestLogStdout)
	orDefault(&r.MaxSizeMB, 100)
	orDefault(&r.MaxBackups, 5)
}

func (c *Config) validateRequestLog(bad func(field, format string, a ...any)) {
	r := &c.RequestLog
	if r.Sample < 0 || r.Sample > 1 {
		bad("request_log.sample", "%v is not a fraction in [0, 1] (0 off, 1 every request)", r.Sample)
	}
	switch r.To {
	case RequestLogStdout, RequestLogStderr, RequestLogSyslog:
	case RequestLogFile:
		if r.File == "" {
			bad("request_log.file", "is required with to: file")
		}
	default:
		bad("request_log.to", "%q is not one of stdout, stderr, file, syslog", r.To)
	}
	if r.File != "" && r.To != RequestLogFile {
		bad("request_log.file", "is set but to is %q (set to: file)", r.To)
	}
	if r.MaxSizeMB < 1 {
		bad("request_log.max_size_mb", "%d must be at least 1", r.MaxSizeMB)
	}
	if r.MaxBackups < 0 {
		bad("request_log.max_backups", "%d is negative", r.MaxBackups)
	}
	if r.MaxAgeDays < 0 {
		bad("request_log.max_age_days", "%d is negative (0 keeps files of any age)", r.MaxAgeDays)
	}
	if r.Syslog != "" {
		network, addr := r.SyslogTarget()
		if network != "udp" && network != "tcp" {
			bad("request_log.syslog", "%q is not udp://host:port or tcp://host:port (empty: the local syslog daemon)", r.Syslog)
		} else if _, _, err := net.SplitHostPort(addr); err != nil {
			bad("request_log.syslog", "%q: %s", r.Syslog, fmt.Sprint(err))
		}
		if r.To != RequestLogSyslog {
			bad("request_log.syslog", "is set but to is %q (set to: syslog)", r.To)
		}
	}
}
