package proxyconf

import (
	"os/exec"
	"time"

	"github.com/rs/zerolog"
)

// SyncDefaults are the settings both proxies' syncers share, filled in by
// Fill: the proxy binary, how long a reload may take, how often to poll.
type SyncDefaults struct {
	Bin           *string
	ReloadTimeout *time.Duration
	PollInterval  *time.Duration
}

// Fill sets each unset field: Bin to name as found on PATH (left empty
// when it is not there: the sync says so when it needs it), ReloadTimeout
// to 15s, PollInterval to poll.
func (s SyncDefaults) Fill(name string, poll time.Duration) {
	if *s.Bin == "" {
		if p, err := exec.LookPath(name); err == nil {
			*s.Bin = p
		}
	}
	if *s.ReloadTimeout <= 0 {
		*s.ReloadTimeout = 15 * time.Second
	}
	if *s.PollInterval <= 0 {
		*s.PollInterval = poll
	}
}

// Logger returns log, or a logger that drops everything when log is nil.
func Logger(log *zerolog.Logger) *zerolog.Logger {
	if log == nil {
		l := zerolog.Nop()
		return &l
	}
	return log
}
