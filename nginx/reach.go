package nginx

import (
	"context"

	"github.com/turnout/turnout/internal/proxyconf"
)

// watchRunning logs "nginx running" once pidFile names a live nginx after
// a sync found it not running (proxyconf.UpWatch).
func (s *Syncer) watchRunning(ctx context.Context, pidFile string) {
	s.run.Watch(ctx, func(context.Context) bool {
		pid, err := proxyconf.ReadPID(pidFile, "nginx")
		if err != nil {
			return false
		}
		s.log.Info().Int(fieldPID, pid).Msg("nginx running: it loaded the written files")
		return true
	})
}
