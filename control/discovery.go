package control

import (
	"context"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/control/discovery"
	"github.com/turnout/turnout/control/discovery/kube"
	"github.com/turnout/turnout/internal/config"
)

// newFleet is the Kubernetes source: the fleet merges discovered endpoints
// into the file config and hands each merge to apply. The Kubernetes client
// is made only when a pool asks for it, and a failed first list is logged at
// start (RBAC, unreachable API) while the informers keep retrying.
func newFleet(ctx context.Context, c core, kubeconfig string, log *zerolog.Logger,
	apply func(*config.Config, bool, time.Duration) error) *discovery.Fleet {
	return discovery.New(discovery.Options{
		Log:      log,
		Apply:    apply,
		Inflight: c.inflight,
		NewSource: func(notify func()) (discovery.Source, error) {
			rc, err := kube.RESTConfig(kubeconfig)
			if err != nil {
				return nil, err
			}
			health := kube.NewAPIHealth(log)
			health.Wrap(rc)
			cs, err := kube.NewClient(rc)
			if err != nil {
				return nil, err
			}
			src := kube.New(kube.Options{Client: cs, Log: log, Notify: notify})
			health.Start(ctx, cs, src.Restart)
			go func() {
				// After Configure started the watches: say at once what is wrong.
				time.Sleep(100 * time.Millisecond)
				pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				if err := src.Probe(pctx); err != nil {
					log.Error().Err(err).Str("host", rc.Host).Msg("kubernetes discovery cannot list its objects; discovered pools stay empty (/readyz 503) until it can")
				} else {
					log.Info().Str("host", rc.Host).Msg("kubernetes discovery connected")
				}
			}()
			return src, nil
		},
	})
}
