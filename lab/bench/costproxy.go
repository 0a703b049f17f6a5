package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/turnout/turnout/lab/mock"
)

// CostMockArgs make replicas answer at once (no model time) while streams
// still come as separate 1 ms-spaced chunks, so the proxies are the cost.
func CostMockArgs() []string {
	return []string{"--ttft-overhead", "0s", "--per-token-prefill", "0s", "--itl", "1ms", "--time-scale", "1",
		"--max-running", "0", "--cache-blocks", "4096", "--request-log-size", "-1"}
}

// costProxy compares each proxy alone with the same proxy + turnout, all in
// front of the same replicas and measured in the same interleaved rounds,
// so a noisy neighbour hurts every row alike.
func costProxy(ctx context.Context, o CostOptions) ([]CostRow, error) {
	stacks, notes, err := proxyStacks(o)
	if err != nil || len(stacks) == 0 {
		return notes, err
	}
	var mocks procSet
	defer mocks.stopAll()
	eps, err := startMocks(ctx, &mocks, o.Dir, o.Lab, "llama", max(o.Replicas, 1), false, CostMockArgs())
	if err != nil {
		return nil, err
	}
	small := CostBodies(64, "llama", 1, false, 2)
	var large []CostBody
	if o.LargeBody > 0 {
		large = CostBodiesSized(16, "llama", 1, false, 4, o.LargeBody)
	}
	var targets, sseTargets, idleTargets []costTarget
	for _, ps := range stacks {
		so := ps.opts
		so.Dir, so.Mocks = filepath.Join(o.Dir, ps.dir), eps
		if err := os.MkdirAll(so.Dir, 0o755); err != nil {
			return nil, fmt.Errorf("cost dir: %w", err)
		}
		st, err := StartStack(ctx, so)
		if err != nil {
			return nil, fmt.Errorf("cost %s: %w", ps.name, err)
		}
		defer st.Stop()
		t := costTarget{Group: ps.group, LoadTarget: LoadTarget{Name: ps.name, Addr: strings.TrimPrefix(st.FrontURL, "http://"), Path: mock.PathChat},
			Bodies: small, Conns: o.Conns, Duration: o.Duration, ProxyPIDs: procTree(st.ProxyPID), BestOf: ps.bestOf}
		if st.TurnoutPID > 0 {
			t.TurnoutPIDs = []int{st.TurnoutPID}
		}
		targets = append(targets, t)
		if large != nil {
			lt := t
			lt.Group, lt.Bodies = fmt.Sprintf("%s-%dk", ps.group, o.LargeBody>>10), large
			targets = append(targets, lt)
		}
		if o.LatencyDuration > 0 {
			ct := t
			ct.Group, ct.Conns, ct.Duration = ps.group+"-c1", 1, o.LatencyDuration
			targets = append(targets, ct)
		}
		st1 := t
		st1.Group = ps.group + "-sse"
		sseTargets = append(sseTargets, st1)
		if ps.group == "haproxy" && o.IdleConns > 0 && st1.ProxyPIDs != nil {
			it := t
			it.Group = "haproxy-idle"
			idleTargets = append(idleTargets, it)
		}
	}
	// One interleaved set of rounds for every load shape, so a noisy
	// neighbour hits all of them alike; rows are regrouped for the tables.
	rows, err := runRounds(ctx, o, targets)
	if err != nil {
		return nil, err
	}
	slices.SortStableFunc(rows, func(a, b CostRow) int { return strings.Compare(groupOrder(a.Group), groupOrder(b.Group)) })
	sse, err := sseProbe(ctx, o, sseTargets, CostBodies(16, "llama", 8, true, 3))
	if err != nil {
		return nil, err
	}
	idle, err := idleRows(ctx, o, idleTargets)
	if err != nil {
		return nil, err
	}
	return slices.Concat(rows, sse, idle, notes), nil
}

// groupOrder sorts the load groups: per proxy, the main rows, the large
// bodies, then one connection.
func groupOrder(g string) string {
	proxy, shape, _ := strings.Cut(g, "-")
	switch {
	case shape == "":
		shape = "0"
	case shape == "c1":
		shape = "2"
	default:
		shape = "1" + shape
	}
	return proxy + "/" + shape
}
