//go:build e2e

package e2e

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/turnout/turnout/lab/mock"
	"github.com/turnout/turnout/lab/testenv/kubetest"
)

// kubeBenchEnv enables the Kubernetes measurements of BENCHMARKS.md
// (make bench-kube); they measure, they assert only that things happened.
const kubeBenchEnv = "TURNOUT_KUBE_BENCH"

func needKubeBench(t *testing.T) {
	t.Helper()
	if os.Getenv(kubeBenchEnv) == "" {
		t.Skip("measurement for BENCHMARKS.md: set " + kubeBenchEnv + "=1 (make bench-kube)")
	}
}

func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(float64(len(s)-1) * p)
	return s[i]
}

// TestKubeChangeLatency measures the time from an EndpointSlice write
// (the API server accepted it) to HAProxy's runtime state showing it, over
// 100 changes cycling add -> terminating (DRAIN) -> ready -> removed.
func TestKubeChangeLatency(t *testing.T) {
	needKubeBench(t)
	if !inNetns(t) {
		return
	}
	NeedHAProxy(t)
	c := kubetest.Start(t, repoRoot(), "llm", "10.244.0.1")
	kubeMock(t, "m-0", "10.244.0.10", mock.RoleMixed)
	kubeMock(t, "m-1", "10.244.0.11", mock.RoleMixed)
	slice := func(n int, term bool) *discoveryv1.EndpointSlice {
		es := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: "vllm-a", Labels: map[string]string{discoveryv1.LabelServiceName: "vllm"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: kptr("http"), Port: kptr(int32(8000))}},
			Endpoints:   []discoveryv1.Endpoint{kubeEP("m-0", "10.244.0.10", true, false)},
		}
		if n > 1 {
			es.Endpoints = append(es.Endpoints, kubeEP("m-1", "10.244.0.11", true, term))
		}
		return es
	}
	putSlice(t, c, slice(1, false))
	dir := t.TempDir()
	tAddr, hAddr := FreeAddr(t), FreeAddr(t)
	StartTurnout(t, tAddr, fmt.Sprintf(`listen: %s
feedback: {syslog: %s}
health: {interval: 300ms, timeout: 300ms}
haproxy: {listen: %q, dir: %q, drain_timeout: 2s, nbthread: 2}
deployments:
  - name: chat
    models: [chat]
    pools:
      - role: mixed
        discovery: {kubernetes: {namespace: llm, service: vllm, port: http}}
`, tAddr, FreeUDPAddr(t), hAddr, dir), "--haproxy-dir", dir, "--kubeconfig", c.Kubeconfig(kubetest.TurnoutToken))
	Eventually(t, 30*time.Second, "haproxy.cfg", func() bool {
		_, err := os.Stat(filepath.Join(dir, "haproxy.cfg"))
		return err == nil
	})
	h := StartHAProxy(t, dir, hAddr)
	h.WaitServersUp(t, "chat_mixed/m-0")
	master := h.Cmd.Process.Pid

	steps := []struct {
		what string
		es   *discoveryv1.EndpointSlice
		want func(st string, ok bool) bool
	}{
		{"add", slice(2, false), func(st string, ok bool) bool { return ok && st != "MAINT" }},
		// "DRAIN 1/2": drained while its health checks are still rising
		// (rise+fall-1); waiting for a bare "DRAIN" measured the next check
		// (~140 ms here), not the drain.
		{"terminating", slice(2, true), func(st string, _ bool) bool { return strings.HasPrefix(st, "DRAIN") }},
		{"ready", slice(2, false), func(st string, ok bool) bool {
			return ok && !strings.HasPrefix(st, "DRAIN") && !strings.HasPrefix(st, "MAINT")
		}},
		{"remove", slice(1, false), func(_ string, ok bool) bool { return !ok }},
	}
	var all []time.Duration
	by := map[string][]time.Duration{}
	for i := range 100 {
		s := steps[i%len(steps)]
		putSlice(t, c, s.es)
		at := time.Now()
		for {
			st, ok := h.ServerStatus(t)["chat_mixed/m-1"]
			if s.want(st, ok) {
				break
			}
			if time.Since(at) > 10*time.Second {
				t.Fatalf("change %d (%s): HAProxy state %q after 10s", i, s.what, st)
			}
			time.Sleep(2 * time.Millisecond)
		}
		d := time.Since(at)
		all = append(all, d)
		by[s.what] = append(by[s.what], d)
		time.Sleep(150 * time.Millisecond) // separate changes: each is its own debounce window
	}
	for _, s := range steps {
		t.Logf("%-12s n=%d p50=%v p99=%v", s.what, len(by[s.what]), percentile(by[s.what], 0.5).Round(time.Millisecond), percentile(by[s.what], 0.99).Round(time.Millisecond))
	}
	// A terminating pod drains as fast as any other change (issue 28 item 9).
	if term, add := percentile(by["terminating"], 0.5), percentile(by["add"], 0.5); term > add*3/2+20*time.Millisecond {
		t.Errorf("terminating p50 %v, add p50 %v: the drain is slower than other changes", term, add)
	}
	t.Logf("RESULT slice change -> HAProxy runtime state, %d changes: p50=%v p99=%v max=%v", len(all),
		percentile(all, 0.5).Round(time.Millisecond), percentile(all, 0.99).Round(time.Millisecond), slices.Max(all).Round(time.Millisecond))
	if h.Cmd.Process.Pid != master {
		t.Errorf("HAProxy master changed")
	}
}

// TestKubeScale measures turnout with 1,000 and 5,000 discovered endpoints
// (100 per EndpointSlice, as the EndpointSlice controller cuts them) from
// a real API server: time from start to the pool swapped in, to
// haproxy.cfg written with every server, for one endpoint changing, and
// turnout's RSS. No replica listens: health checks and proxies are off, so
// nothing is sent to the 10.244.x.y addresses; no network namespace needed.
func TestKubeScale(t *testing.T) {
	needKubeBench(t)
	kubetest.Binaries(t)
	c := kubetest.Start(t, repoRoot(), "llm", "")
	for _, n := range []int{1000, 5000} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			svc := fmt.Sprintf("vllm-%d", n)
			mk := func(k int, notReady int) *discoveryv1.EndpointSlice {
				es := &discoveryv1.EndpointSlice{
					ObjectMeta:  metav1.ObjectMeta{Name: fmt.Sprintf("%s-%03d", svc, k), Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
					AddressType: discoveryv1.AddressTypeIPv4,
					Ports:       []discoveryv1.EndpointPort{{Name: kptr("http"), Port: kptr(int32(8000))}},
				}
				for j := range 100 {
					i := k*100 + j
					es.Endpoints = append(es.Endpoints, kubeEP(fmt.Sprintf("%s-%d", svc, i), fmt.Sprintf("10.244.%d.%d", i/250, i%250+1), i != notReady, false))
				}
				return es
			}
			for k := range n / 100 {
				putSlice(t, c, mk(k, -1))
			}
			dir := t.TempDir()
			addr := FreeAddr(t)
			start := time.Now()
			tu := StartTurnout(t, addr, fmt.Sprintf(`listen: %s
feedback: {syslog: %s}
health: {disable: true}
haproxy: {listen: %q, dir: %q}
deployments:
  - name: chat
    models: [chat]
    pools:
      - role: mixed
        discovery: {kubernetes: {namespace: llm, service: %s, port: http}}
`, addr, FreeUDPAddr(t), FreeAddr(t), dir, svc), "--haproxy-dir", dir, "--kubeconfig", c.Kubeconfig(kubetest.TurnoutToken))
			poolLine := fmt.Sprintf(`"n_ready":%d`, n)
			Eventually(t, 60*time.Second, "the pool with every endpoint", func() bool {
				b, _ := os.ReadFile(tu.Log)
				return bytes.Contains(b, []byte(poolLine))
			})
			swapped := time.Since(start)
			Eventually(t, 60*time.Second, "haproxy.cfg with every server", func() bool {
				b, _ := os.ReadFile(filepath.Join(dir, "haproxy.cfg"))
				return len(serverLine.FindAll(b, -1)) >= n
			})
			written := time.Since(start)
			// One endpoint turns not ready: time to the swapped pool.
			putSlice(t, c, mk(n/200, n/2))
			at := time.Now()
			want := fmt.Sprintf(`"n_ready":%d`, n-1)
			Eventually(t, 30*time.Second, "the pool without one endpoint", func() bool {
				b, _ := os.ReadFile(tu.Log)
				return bytes.Contains(b, []byte(want))
			})
			change := time.Since(at)
			rss := procRSS(t, tu.Cmd.Process.Pid)
			t.Logf("RESULT endpoints=%d: pool swapped %v after start, haproxy.cfg written %v after start, one change %v, turnout RSS %d MiB",
				n, swapped.Round(time.Millisecond), written.Round(time.Millisecond), change.Round(time.Millisecond), rss>>20)
		})
	}
}

var serverLine = regexp.MustCompile(`(?m)^\s+server `)

// procRSS is VmRSS of pid in bytes.
func procRSS(t *testing.T, pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}
