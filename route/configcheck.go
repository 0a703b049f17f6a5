package route

import (
	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"
	"github.com/turnout/turnout/route/policy"
)

// CheckPolicies builds every pool's policy from cfg without starting any
// (no KV-event subscriptions, no network), so `turnout render` reports bad
// policy names and params, with their lines, before a proxy is configured.
func CheckPolicies(cfg *config.Config, reg *policy.Registry) error {
	if reg == nil {
		reg = policy.DefaultRegistry()
	}
	var errs []error
	for i := range cfg.Deployments {
		dc := &cfg.Deployments[i]
		for j := range dc.Pools {
			pc := &dc.Pools[j]
			p := &fleet.Pool{Name: config.PoolName(dc.Name, pc.Role), Deployment: dc.Name, Role: pc.Role}
			for k, ec := range pc.Endpoints {
				p.Endpoints = append(p.Endpoints, &fleet.Endpoint{Name: ec.Name, Address: ec.Address, KVEvents: ec.KVEvents, Index: k})
			}
			pol, err := reg.Build(dc.PoolPolicy(pc), fleet.PolicyEnv{Pool: p, Rand: fleet.NewRand(1)})
			if err != nil {
				errs = append(errs, err)
				continue
			}
			closeAll([]fleet.Policy{pol})
		}
	}
	if ce := config.AsError(errs); ce != nil {
		return ce
	}
	return nil
}
