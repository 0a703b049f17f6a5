package control

import (
	"io"
	"sync"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/reqlog"
)

// requestLogs keeps the request log (request_log) in line with the applied
// config: reopened only when its section changes, the old destination
// closed after the Decider moved to the new one.
type requestLogs struct {
	log            *zerolog.Logger
	core           core
	stdout, stderr io.Writer

	mu  sync.Mutex
	key config.RequestLogConfig
	cur *reqlog.Log
}

// apply is an OnApply hook: the config was accepted, so a destination that
// cannot be opened is logged and the previous one kept.
func (r *requestLogs) apply(c *config.Config) {
	r.mu.Lock()
	defer r.mu.Unlock()
	want := c.RequestLog
	if want == r.key && (r.cur != nil) == want.On() {
		if r.cur != nil {
			r.core.setRequestLog(r.cur, want.Sample)
		}
		return
	}
	var next *reqlog.Log
	if want.On() {
		l, err := reqlog.Open(&want, r.stdout, r.stderr)
		if err != nil {
			r.log.Error().Err(err).Msg("request log not opened; keeping the previous one")
			return
		}
		next = l
		r.core.setRequestLog(l, want.Sample)
		r.log.Info().Str("to", want.To).Float64("sample", want.Sample).Msg("request log on")
	} else {
		r.core.setRequestLog(nil, 0)
	}
	r.closeCur()
	r.cur, r.key = next, want
}

// close closes the destination at shutdown.
func (r *requestLogs) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.core.setRequestLog(nil, 0)
	r.closeCur()
	r.cur = nil
}

func (r *requestLogs) closeCur() {
	if r.cur != nil {
		if err := r.cur.Close(); err != nil {
			r.log.Warn().Err(err).Msg("request log close")
		}
	}
}
