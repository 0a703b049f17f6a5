//go:build e2e

package bench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/turnout/turnout/route/policy"
)

// A tiny replay with turnout in the Endpoint Picker seat: real `turnout
// serve` and `turnout-lab mock` processes, the driver as the Envoy-like
// gateway. Every request is answered through the ext_proc response phase,
// prefix-affinity finds cached prefixes, and round-robin's picks spread
// the requests evenly by the replicas' own counts.
func TestReplayEPPSeatE2E(t *testing.T) {
	turnout, lab := e2eBinaries(t)
	reqs := SyntheticTrace(40, 3)
	o := DefaultSimOptions()
	o.Replicas, o.Concurrency = 3, 8
	specs := []PolicySpec{{Policy: policy.PrefixAffinityType}, {Policy: policy.RoundRobinType}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rows, err := RunE2E(ctx, reqs, "synthetic", specs, E2EOptions{
		Sim: o, TimeScale: 0.01, ProxySetup: ProxySetup{Proxy: ProxyEPP, Turnout: turnout, Lab: lab},
		WorkDir: t.TempDir(), Timeout: 3 * time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(specs) {
		t.Fatalf("%d rows for %d specs", len(rows), len(specs))
	}
	for i, r := range rows {
		t.Logf("%s %s: %d requests, %d errors, hit %.3f, ttft p50 %.1f ms, detail %q", r.Mode, r.Policy, r.Requests, r.Errors, r.HitRatio, r.TTFT.P50, r.Detail)
		if r.Mode != ModeE2EEPP || r.Policy != specs[i].String() {
			t.Fatalf("row %d: mode %q policy %q", i, r.Mode, r.Policy)
		}
		if r.Requests != len(reqs) || r.Errors != 0 {
			t.Fatalf("%s: %d answered, %d errors, want all %d", r.Policy, r.Requests, r.Errors, len(reqs))
		}
		if err := r.Check(); err != nil {
			t.Fatal(err)
		}
		if r.TTFT.P50 <= 0 || r.TTFT.P99 < r.TTFT.P50 {
			t.Fatalf("%s: ttft %+v", r.Policy, r.TTFT)
		}
		if r.Detail == "" {
			t.Fatalf("%s: no decisions in turnout's metrics", r.Policy)
		}
	}
	if rows[0].HitRatio <= 0 {
		t.Fatalf("prefix-affinity: hit ratio %v, want cached prefixes found", rows[0].HitRatio)
	}
	// Round-robin's picks were followed: the replicas' own counts are even.
	if rows[1].LoadReq > 1.1 {
		t.Fatalf("round-robin: requests max/mean %.3f across the replicas", rows[1].LoadReq)
	}
}

// e2eBinaries are turnout and turnout-lab: $TURNOUT_BIN and
// $TURNOUT_LAB_BIN (make test-e2e sets both), else built once into the
// test's directory.
func e2eBinaries(t *testing.T) (turnout, lab string) {
	t.Helper()
	find := func(env, pkg string) string {
		if b := os.Getenv(env); b != "" {
			return b
		}
		_, file, _, _ := runtime.Caller(0)
		out := filepath.Join(t.TempDir(), filepath.Base(pkg))
		cmd := exec.Command("go", "build", "-o", out, "./"+pkg)
		cmd.Dir = filepath.Join(filepath.Dir(file), "..", "..")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, b)
		}
		return out
	}
	return find("TURNOUT_BIN", "cmd/turnout"), find("TURNOUT_LAB_BIN", "cmd/turnout-lab")
}
