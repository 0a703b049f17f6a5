package cli

import (
	"io"

	"github.com/rs/zerolog"
)

// journaldWriter prefixes each JSON line with its syslog priority, "<N>",
// which journald reads from a service's stdout/stderr (SyslogLevelPrefix=,
// on by default) and strips: `journalctl -p warning` then shows warnings
// and worse. The rest of the line stays zerolog's JSON.
type journaldWriter struct{ w io.Writer }

var _ zerolog.LevelWriter = journaldWriter{}

// journaldPriority maps zerolog's levels to syslog priorities (RFC 5424:
// 0 emerg .. 7 debug).
func journaldPriority(l zerolog.Level) string {
	switch l {
	case zerolog.TraceLevel, zerolog.DebugLevel:
		return "<7>"
	case zerolog.WarnLevel:
		return "<4>"
	case zerolog.ErrorLevel:
		return "<3>"
	case zerolog.FatalLevel:
		return "<2>"
	case zerolog.PanicLevel:
		return "<0>"
	default: // info, no level
		return "<6>"
	}
}

func (j journaldWriter) Write(p []byte) (int, error) {
	return j.WriteLevel(zerolog.NoLevel, p)
}

// WriteLevel writes the prefix and the line in one write, so concurrent
// lines never interleave.
func (j journaldWriter) WriteLevel(l zerolog.Level, p []byte) (int, error) {
	pre := journaldPriority(l)
	b := make([]byte, 0, len(pre)+len(p))
	b = append(append(b, pre...), p...)
	if _, err := j.w.Write(b); err != nil {
		return 0, err
	}
	return len(p), nil
}

// LogWriter is where the root logger writes: w itself, or with
// TURNOUT_LOG_FORMAT=journald w behind journald priority prefixes.
func LogWriter(w io.Writer, format string) io.Writer {
	if format == "journald" {
		return journaldWriter{w}
	}
	return w
}
