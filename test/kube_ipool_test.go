//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/turnout/turnout/lab/mock"
	"github.com/turnout/turnout/lab/testenv/kubetest"
	"github.com/turnout/turnout/nginx"
)

// ipoolPorts are the InferencePool's target ports: two data-parallel ranks per pod.
var ipoolPorts = []int{8000, 8001}

// ipoolPod starts the mock replicas of pod i (10.244.0.(10+i)), one per
// rank, answering as the endpoint name turnout gives them.
func ipoolPod(t *testing.T, i int) {
	t.Helper()
	for rank, port := range ipoolPorts {
		name := fmt.Sprintf("c-%d_rank%d", i, rank)
		StartMockAt(t, name, fmt.Sprintf("10.244.0.%d:%d", 10+i, port), func(c *mock.Config) {
			c.Role = mock.RoleMixed
			c.TimeScale = 0.5 // 10 ms per token: streams overlap the membership changes
		})
	}
}

func ipoolServers(pods ...int) []string {
	var ids []string
	for _, i := range pods {
		for rank := range ipoolPorts {
			ids = append(ids, fmt.Sprintf("chat_mixed/c-%d_rank%d", i, rank))
		}
	}
	return ids
}

// TestKubeInferencePool: turnout follows an InferencePool (two target
// ports: two endpoints per pod) on a real API server, with turnout's Role
// plus the chart's inferencepools rule, and keeps HAProxy and nginx in
// line under streaming load through both: pods added (scale-up),
// relabelled out of the selector, deleted (terminating, then gone), the
// pool deleted and re-created within vanish_grace; no request fails.
// Then 40 changes of one pod measure API change -> HAProxy runtime state
// (p99 <= 1 s).
func TestKubeInferencePool(t *testing.T) {
	if !inNetns(t) {
		return
	}
	NeedHAProxy(t)
	NeedNginx(t)
	root := repoRoot()
	c := kubetest.Start(t, root, "llm", "10.244.0.1")
	c.GrantInferencePools()
	c.InstallInferencePoolCRD(root)
	ctx := context.Background()
	app := func(v string) map[string]string { return map[string]string{"app": v} }
	for i := range 4 {
		ipoolPod(t, i)
	}
	for i := range 2 {
		if err := c.PutPod(fmt.Sprintf("c-%d", i), app("chat"), fmt.Sprintf("10.244.0.%d", 10+i), true); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.PutInferencePool("chat", app("chat"), ipoolPorts...); err != nil {
		t.Fatal(err)
	}

	hdir, ndir := t.TempDir(), t.TempDir()
	tAddr, hAddr, nAddr := FreeAddr(t), FreeAddr(t), FreeAddr(t)
	tu := StartTurnout(t, tAddr, fmt.Sprintf(`listen: %s
feedback: {syslog: %s}
health: {interval: 300ms, timeout: 300ms}
proxy: {route_timeout: 5s}
haproxy: {listen: %q, dir: %q, drain_timeout: 10s, nbthread: 2}
nginx: {listen: %q, dir: %q, mode: body}
deployments:
  - name: chat
    models: [chat]
    policy: {name: least-request}
    pools:
      - role: mixed
        discovery: {kubernetes: {namespace: llm, inference_pool: chat, vanish_grace: 10s}}
`, tAddr, FreeUDPAddr(t), hAddr, hdir, nAddr, ndir), "--haproxy-dir", hdir, "--nginx-dir", ndir, "--nginx-user", "root",
		"--kubeconfig", c.Kubeconfig(kubetest.TurnoutToken))
	Eventually(t, 30*time.Second, "turnout to write haproxy.cfg and nginx.conf", func() bool {
		_, err1 := os.Stat(filepath.Join(hdir, "haproxy.cfg"))
		_, err2 := os.Stat(filepath.Join(ndir, nginx.ConfigFile))
		return err1 == nil && err2 == nil
	})
	h := StartHAProxy(t, hdir, hAddr)
	h.WaitServersUp(t, ipoolServers(0, 1)...)
	StartNginx(t, ndir, nAddr)
	WaitHTTP(t, tu.URL+"/readyz", 10*time.Second)
	haMaster := h.Cmd.Process.Pid
	logCount := func(msg string) int {
		b, _ := os.ReadFile(tu.Log)
		return strings.Count(string(b), msg)
	}

	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	lctx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	haLoad, ngLoad := &kubeLoad{name: "haproxy", model: "chat"}, &kubeLoad{name: "nginx", model: "chat"}
	haLoad.run(lctx, client, h.URL+"/v1/chat/completions", 8, 100*time.Millisecond)
	ngLoad.run(lctx, client, "http://"+nAddr+"/v1/chat/completions", 4, 100*time.Millisecond)
	loadStart := time.Now()
	seenBoth := func(names ...string) {
		t.Helper()
		for _, n := range names {
			Eventually(t, 15*time.Second, n+" answers through HAProxy and nginx", func() bool {
				_, a := haLoad.firstSeen(n)
				_, b := ngLoad.firstSeen(n)
				return a && b
			})
		}
	}
	seenBoth("c-0_rank0", "c-0_rank1", "c-1_rank0", "c-1_rank1")

	// Scale-up: c-2 turns ready; both its ranks join both proxies, nginx
	// without a reload (it routes to the addresses turnout answers).
	ngReloads := logCount("reloading nginx")
	if err := c.PutPod("c-2", app("chat"), "10.244.0.12", true); err != nil {
		t.Fatal(err)
	}
	h.WaitServersUp(t, ipoolServers(2)...)
	seenBoth("c-2_rank0", "c-2_rank1")
	if got := logCount("reloading nginx"); got != ngReloads {
		t.Errorf("nginx reloaded %d times for a new pod", got-ngReloads)
	}

	// c-0 relabelled out of the selector: its ranks drain and leave.
	gone := func(ids ...string) {
		t.Helper()
		Eventually(t, 20*time.Second, "HAProxy without "+strings.Join(ids, ","), func() bool {
			st := h.ServerStatus(t)
			for _, id := range ids {
				if _, ok := st[id]; ok {
					return false
				}
			}
			return true
		})
	}
	if err := c.PutPod("c-0", app("retired"), "10.244.0.10", true); err != nil {
		t.Fatal(err)
	}
	gone(ipoolServers(0)...)

	// c-1 deleted: terminating (still Ready) drains it, then it is gone.
	if err := c.DeletePod("c-1"); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 10*time.Second, "c-1 draining in HAProxy", func() bool {
		st := h.ServerStatus(t)
		return strings.HasPrefix(st["chat_mixed/c-1_rank0"], "DRAIN") && strings.HasPrefix(st["chat_mixed/c-1_rank1"], "DRAIN")
	})
	if err := c.ForceDeletePod("c-1"); err != nil {
		t.Fatal(err)
	}
	gone(ipoolServers(1)...)

	// The pool deleted and re-created within vanish_grace: c-2 is kept
	// meanwhile, nothing fails.
	held := logCount("vanished")
	if err := c.DeleteInferencePool("chat"); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 10*time.Second, "turnout to hold the vanished pool", func() bool { return logCount("vanished") > held })
	if err := c.PutInferencePool("chat", app("chat"), ipoolPorts...); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 10*time.Second, "the hold to end", func() bool {
		return logCount("back; the kept endpoints are replaced") > 0
	})
	if st := h.ServerStatus(t); st["chat_mixed/c-2_rank0"] != "UP" || st["chat_mixed/c-2_rank1"] != "UP" {
		t.Errorf("c-2 not UP after the pool came back: %v", st)
	}

	// Change latency: c-3 turns ready, not ready, relabelled in and out.
	type step struct {
		what   string
		labels map[string]string
		ready  bool
		want   func(st string, ok bool) bool
	}
	in := func(st string, ok bool) bool { return ok && st != "MAINT" && !strings.HasPrefix(st, "DRAIN") }
	out := func(st string, ok bool) bool {
		return !ok || strings.HasPrefix(st, "DRAIN") || strings.HasPrefix(st, "MAINT")
	}
	steps := []step{
		{"ready", app("chat"), true, in},
		{"not ready", app("chat"), false, out},
		{"ready again", app("chat"), true, in},
		{"relabelled out", app("retired"), true, out},
	}
	var all []time.Duration
	by := map[string][]time.Duration{}
	for i := range 40 {
		s := steps[i%len(steps)]
		if err := c.PutPod("c-3", s.labels, "10.244.0.13", s.ready); err != nil {
			t.Fatal(err)
		}
		at := time.Now()
		for {
			st := h.ServerStatus(t)
			s0, ok0 := st["chat_mixed/c-3_rank0"]
			s1, ok1 := st["chat_mixed/c-3_rank1"]
			if s.want(s0, ok0) && s.want(s1, ok1) {
				break
			}
			if time.Since(at) > 10*time.Second {
				t.Fatalf("change %d (%s): HAProxy state %q %q after 10s", i, s.what, s0, s1)
			}
			time.Sleep(2 * time.Millisecond)
		}
		d := time.Since(at)
		all = append(all, d)
		by[s.what] = append(by[s.what], d)
	}
	for _, s := range steps {
		t.Logf("%-15s n=%d p50=%v p99=%v", s.what, len(by[s.what]), percentile(by[s.what], 0.5).Round(time.Millisecond), percentile(by[s.what], 0.99).Round(time.Millisecond))
	}
	p99 := percentile(all, 0.99)
	t.Logf("RESULT InferencePool pod change -> HAProxy runtime state, %d changes: p50=%v p99=%v max=%v", len(all),
		percentile(all, 0.5).Round(time.Millisecond), p99.Round(time.Millisecond), slices.Max(all).Round(time.Millisecond))
	if p99 > time.Second {
		t.Errorf("change latency p99 %v, want <= 1s", p99)
	}

	stopLoad()
	haLoad.wg.Wait()
	ngLoad.wg.Wait()
	elapsed := time.Since(loadStart)
	for _, l := range []*kubeLoad{haLoad, ngLoad} {
		t.Logf("load via %s: %d ok, %d failed or truncated in %v", l.name, l.ok.Load(), l.fail.Load(), elapsed.Round(time.Second))
		if l.fail.Load() > 0 {
			t.Errorf("via %s: %d failed or truncated requests, e.g. %v", l.name, l.fail.Load(), l.failures)
		}
		if l.ok.Load() == 0 {
			t.Errorf("via %s: no request completed", l.name)
		}
	}
	if h.Cmd.Process.Pid != haMaster {
		t.Error("HAProxy master changed: membership changes must not restart it")
	}
}
