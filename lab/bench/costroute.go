package bench

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"

	"github.com/turnout/turnout/route/contract"
)

// costRoute compares /internal/route (one turnout per policy) with the
// trivial handler. No completion feedback is sent: turnout's bounded
// decision ring overwrites (and counts) the oldest open decisions instead.
func costRoute(ctx context.Context, o CostOptions) ([]CostRow, error) {
	var ps procSet
	defer ps.stopAll()
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	tp, err := ps.start(o.Dir, "trivial", o.Lab, "bench", "trivial", "--listen", addr)
	if err != nil {
		return nil, err
	}
	if err := waitHTTP(ctx, tp, "http://"+addr+"/healthz", http.StatusOK, startupWait); err != nil {
		return nil, err
	}
	bodies := CostBodies(64, "llama", 1, false, 1)
	rt := func(name, addr string) costTarget {
		return costTarget{Group: "route", LoadTarget: LoadTarget{Name: name, Addr: addr, Path: contract.PathRoute, RouteHeaders: true},
			Bodies: bodies, Conns: o.Conns, Duration: o.Duration}
	}
	targets := []costTarget{rt("trivial-fasthttp", addr)}
	eps := make([]Endpoint, max(o.Replicas, 1))
	for i := range eps {
		eps[i] = Endpoint{Name: "r" + strconv.Itoa(i), Address: "127.0.0.1:" + strconv.Itoa(18000+i)}
	}
	for _, pol := range o.Policies {
		spec, err := ParsePolicySpec(pol)
		if err != nil {
			return nil, err
		}
		listen, syslog, err := turnoutAddrs()
		if err != nil {
			return nil, err
		}
		cfgPath := filepath.Join(o.Dir, "route-"+spec.Policy+".yaml")
		cfg := TurnoutConfig(ConfigOptions{Listen: listen, Model: "llama", Policy: spec, Endpoints: eps, DisableHealth: true,
			Syslog: syslog})
		if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
			return nil, fmt.Errorf("cost config: %w", err)
		}
		p, err := ps.start(o.Dir, "turnout-"+spec.Policy, o.Turnout, "serve", "--config", cfgPath, "--watch", "0", "--log-level", "warn")
		if err != nil {
			return nil, err
		}
		if err := waitHTTP(ctx, p, "http://"+listen+contract.PathReadyz, http.StatusOK, startupWait); err != nil {
			return nil, err
		}
		targets = append(targets, rt("route "+spec.String(), listen))
	}
	return runRounds(ctx, o, targets)
}
