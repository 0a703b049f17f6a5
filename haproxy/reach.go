package haproxy

import "context"

// watchReachable logs "HAProxy connected" once the runtime API on socket
// answers again after a sync found it unreachable (proxyconf.UpWatch).
func (s *Syncer) watchReachable(ctx context.Context, socket string) {
	s.reach.Watch(ctx, func(ctx context.Context) bool {
		if _, err := s.opts.dial(ctx, socket); err != nil {
			return false
		}
		s.log.Info().Str("socket", socket).Msg("HAProxy connected: its runtime API answers")
		return true
	})
}
