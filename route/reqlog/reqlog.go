// Package reqlog writes the request log (docs/request-log.md): one JSON
// line per completed request that the Decider samples (the decision ledger
// joined with the proxy's feedback line), and one per request turnout
// refused itself, to its own destination: stdout, stderr, a rotated file
// or syslog. The fields are route.DecisionRecord's, written by its Fields.
package reqlog

import (
	"fmt"
	"io"
	"log/syslog"

	"github.com/rs/zerolog"
	"gopkg.in/natefinch/lumberjack.v2"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route"
)

// Log is one opened request log, a route.RequestSink.
type Log struct {
	log    zerolog.Logger
	closer io.Closer // the file or syslog connection; nil for stdout/stderr
}

var _ route.RequestSink = (*Log)(nil)

// Open opens the destination c names; stdout and stderr are the process's.
func Open(c *config.RequestLogConfig, stdout, stderr io.Writer) (*Log, error) {
	var w io.Writer
	var closer io.Closer
	switch c.To {
	case config.RequestLogStderr:
		w = stderr
	case config.RequestLogFile:
		// lumberjack: size-based rotation with backups and an age limit,
		// opened lazily, safe for concurrent writes (a mutex per write).
		lj := &lumberjack.Logger{Filename: c.File, MaxSize: c.MaxSizeMB, MaxBackups: c.MaxBackups, MaxAge: c.MaxAgeDays}
		w, closer = lj, lj
	case config.RequestLogSyslog:
		network, addr := c.SyslogTarget()
		sw, err := syslog.Dial(network, addr, syslog.LOG_INFO|syslog.LOG_LOCAL0, "turnout")
		if err != nil {
			return nil, fmt.Errorf("request_log.syslog %q: %w", c.Syslog, err)
		}
		w, closer = sw, sw
	default:
		w = stdout
	}
	return &Log{log: zerolog.New(w).With().Timestamp().Logger(), closer: closer}, nil
}

// Request writes one record: a line with message "request".
func (l *Log) Request(r *route.DecisionRecord) {
	r.Fields(l.log.Log()).Msg("request")
}

// Close closes the file or syslog connection.
func (l *Log) Close() error {
	if l.closer == nil {
		return nil
	}
	if err := l.closer.Close(); err != nil {
		return fmt.Errorf("request log: %w", err)
	}
	return nil
}
