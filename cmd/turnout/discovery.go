package main

import (
	"context"
	"time"

	"github.com/turnout/turnout/internal/config"

	"github.com/rs/zerolog"
	"k8s.io/client-go/kubernetes"

	"github.com/turnout/turnout/internal/discovery"
	"github.com/turnout/turnout/internal/discovery/kube"
	"github.com/turnout/turnout/route"
)

// newFleet wires discovery to the server: the Kubernetes client is made
// only when a pool asks for it, and a failed first list is logged at start
// (RBAC, unreachable API) while the informers keep retrying.
func newFleet(ctx context.Context, srv *route.Decider, kubeconfig string, log *zerolog.Logger,
	apply func(*config.Config, bool) error) *discovery.Fleet {
	return discovery.New(discovery.Options{
		Log:   log,
		Apply: apply,
		Inflight: func(pool, name string) int64 {
			for _, p := range srv.Snapshot().Pools() {
				if p.Name == pool {
					for _, e := range p.Endpoints {
						if e.Name == name {
							return e.Inflight()
						}
					}
				}
			}
			return 0
		},
		NewSource: func(notify func()) (discovery.Source, error) {
			rc, err := kube.RESTConfig(kubeconfig)
			if err != nil {
				return nil, err
			}
			health := kube.NewAPIHealth(log)
			health.Wrap(rc)
			cs, err := kubernetes.NewForConfig(rc)
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
