package haproxy

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/turnout/turnout/internal/config"
)

// load posts to HAProxy from a few goroutines until stop is closed and
// counts failures; it is bounded by the caller's stop.
func load(t *testing.T, url string, stop <-chan struct{}) (wait func() (ok, failed int64)) {
	t.Helper()
	var okN, failN atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				res, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"model":"m1"}`))
				if err != nil {
					failN.Add(1)
					continue
				}
				_ = res.Body.Close()
				if res.StatusCode != 200 {
					failN.Add(1)
					continue
				}
				okN.Add(1)
			}
		}()
	}
	return func() (int64, int64) { wg.Wait(); return okN.Load(), failN.Load() }
}

func TestLiveSyncMembershipWithoutReload(t *testing.T) {
	reps := []*replica{newReplica(t, "r0"), newReplica(t, "r1"), newReplica(t, "r2")}
	fr := newFakeRoute(t) // turnout "fails": HAProxy balances by itself, which is what this test needs
	opts := liveOpts{routeURL: fr.srv.Listener.Addr().String(), replicas: reps}
	e := startLive(t, opts)
	rt := e.runtime(t)
	pid0, err := WorkerPID(rt)
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewSyncer(SyncOptions{Dir: e.dir, DrainTimeout: 5 * time.Second}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Sync(ctx, e.cfg); err != nil {
		t.Fatalf("no-op sync: %v", err)
	}

	// Add r3, remove r1, under load.
	r3 := newReplica(t, "r3")
	cfg2 := *e.cfg
	cfg2.Deployments = cloneDeployments(e.cfg.Deployments)
	pool := &cfg2.Deployments[0].Pools[0]
	pool.Endpoints = append(pool.Endpoints[:1:1], pool.Endpoints[2], config.EndpointConfig{Name: "r3", Address: r3.addr()})
	stop := make(chan struct{})
	wait := load(t, e.url, stop)
	time.Sleep(200 * time.Millisecond) // let load build up before the change
	if err := s.Sync(ctx, &cfg2); err != nil {
		t.Fatalf("sync: %v", err)
	}
	r1Before := reps[1].hits.Load()
	time.Sleep(300 * time.Millisecond)
	close(stop)
	okN, failN := wait()
	if failN != 0 || okN == 0 {
		t.Fatalf("load: %d ok, %d failed", okN, failN)
	}
	if r3.hits.Load() == 0 {
		t.Error("added server r3 got no traffic")
	}
	if d := reps[1].hits.Load() - r1Before; d != 0 {
		t.Errorf("removed server r1 got %d requests after the sync", d)
	}
	live, err := readLive(rt)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, sv := range live.Backends["m_mixed"] {
		names = append(names, sv.Name)
	}
	if strings.Join(names, ",") != "r0,r2,r3" {
		t.Errorf("live servers %v, want r0,r2,r3", names)
	}
	if pid, _ := WorkerPID(rt); pid != pid0 {
		t.Errorf("worker pid %d -> %d: membership change reloaded HAProxy", pid0, pid)
	}

	// Move r0 onto a new address.
	r4 := newReplica(t, "r4")
	cfg3 := cfg2
	cfg3.Deployments = cloneDeployments(cfg2.Deployments)
	cfg3.Deployments[0].Pools[0].Endpoints[0].Address = r4.addr()
	if err := s.Sync(ctx, &cfg3); err != nil {
		t.Fatalf("sync move: %v", err)
	}
	for range 30 {
		e.post(t, "/v1/completions", `{"model":"m1"}`, nil)
	}
	if r4.hits.Load() == 0 {
		t.Error("moved server r0 did not reach its new address")
	}

	// A new deployment is structural: one reload, new worker, new backend.
	cfg4 := cfg3
	cfg4.Deployments = append(cloneDeployments(cfg3.Deployments), config.DeploymentConfig{
		Name: "n", Models: []string{"n1"},
		Pools: []config.PoolConfig{{Role: config.RoleMixed, Endpoints: []config.EndpointConfig{{Name: "n0", Address: reps[2].addr()}}}},
	})
	if err := s.Sync(ctx, &cfg4); err != nil {
		t.Fatalf("sync structural: %v", err)
	}
	rt = e.runtime(t)
	pid1, _ := WorkerPID(rt)
	if pid1 == pid0 {
		t.Fatal("new deployment did not reload HAProxy")
	}
	live, err = readLive(rt)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := live.Backends["n_mixed"]; !ok || len(live.Backends["m_mixed"]) != 3 {
		t.Fatalf("after reload: %+v", live.Backends)
	}
	// And the next sync of the same config is a no-op.
	if err := s.Sync(ctx, &cfg4); err != nil {
		t.Fatal(err)
	}
	if pid, _ := WorkerPID(rt); pid != pid1 {
		t.Fatalf("repeated sync reloaded again (%d -> %d)", pid1, pid)
	}
}

func cloneDeployments(ds []config.DeploymentConfig) []config.DeploymentConfig {
	out := make([]config.DeploymentConfig, len(ds))
	for i, d := range ds {
		out[i] = d
		out[i].Pools = make([]config.PoolConfig, len(d.Pools))
		for j, p := range d.Pools {
			out[i].Pools[j] = p
			out[i].Pools[j].Endpoints = append([]config.EndpointConfig(nil), p.Endpoints...)
		}
	}
	return out
}

func TestSyncWithoutHAProxyWritesFiles(t *testing.T) {
	dir := t.TempDir()
	cfg, err := config.ParseConfig(config.DefaultConfigYAML)
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewSyncer(SyncOptions{Dir: dir, HAProxyBin: "-"}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{ConfigFile, LuaFile, MapFile} {
		if _, err := readFile(dir, f); err != nil {
			t.Error(err)
		}
	}
}

func readFile(dir, name string) ([]byte, error) { return os.ReadFile(filepath.Join(dir, name)) }
