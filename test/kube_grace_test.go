//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/turnout/turnout/lab/mock"
	"github.com/turnout/turnout/lab/testenv/kubetest"
)

// chatSlice is one slice of the vllm Service listing the named pods
// (pod m-i on 10.244.0.(10+i)).
func chatSlice(name string, pods ...int) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: "vllm"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: kptr("http"), Port: kptr(int32(8000))}},
	}
	for _, i := range pods {
		es.Endpoints = append(es.Endpoints, kubeEP(fmt.Sprintf("m-%d", i), fmt.Sprintf("10.244.0.%d", 10+i), true, false))
	}
	return es
}

// kubeChatStack is turnout (kubernetes discovery of the vllm Service,
// least-request) and HAProxy (its default path) in front of n mock replicas.
func kubeChatStack(t *testing.T, c *kubetest.Cluster, extra string, n int) (*Turnout, *HAProxy, []*Mock) {
	t.Helper()
	var ms []*Mock
	for i := range n {
		ms = append(ms, kubeMock(t, fmt.Sprintf("m-%d", i), fmt.Sprintf("10.244.0.%d", 10+i), mock.RoleMixed))
	}
	dir := t.TempDir()
	tAddr, hAddr := FreeAddr(t), FreeAddr(t)
	tu := StartTurnout(t, tAddr, fmt.Sprintf(`listen: %s
feedback: {syslog: %s}
health: {interval: 300ms, timeout: 300ms}
proxy: {route_timeout: 5s}
haproxy: {listen: %q, dir: %q, nbthread: 2%s}
deployments:
  - name: chat
    models: [chat]
    policy: {name: least-request}
    pools:
      - role: mixed
        discovery: {kubernetes: {namespace: llm, service: vllm, port: http, vanish_grace: 6s}}
`, tAddr, FreeUDPAddr(t), hAddr, dir, extra), "--haproxy-dir", dir, "--kubeconfig", c.Kubeconfig(kubetest.TurnoutToken))
	Eventually(t, 30*time.Second, "haproxy.cfg", func() bool {
		_, err := os.Stat(filepath.Join(dir, "haproxy.cfg"))
		return err == nil
	})
	return tu, StartHAProxy(t, dir, hAddr), ms
}

// TestKubeSlicesRecreated (issue 28 item 9): every EndpointSlice of the
// Service is deleted and re-created under ~100 streamed requests/s (12 clients) through
// HAProxy: within discovery.kubernetes.vanish_grace (6s here) no request
// fails, and the kept endpoints are marked in /readyz?verbose and
// turnout_discovery_held_endpoints. Deleted for longer than the grace, the
// pool empties.
func TestKubeSlicesRecreated(t *testing.T) {
	if !inNetns(t) {
		return
	}
	NeedHAProxy(t)
	c := kubetest.Start(t, repoRoot(), "llm", "10.244.0.1")
	putSlice(t, c, chatSlice("vllm-a", 0))
	putSlice(t, c, chatSlice("vllm-b", 1))
	tu, h, ms := kubeChatStack(t, c, "", 2)
	h.WaitServersUp(t, "chat_mixed/m-0", "chat_mixed/m-1")
	WaitHTTP(t, tu.URL+"/readyz", 10*time.Second)
	held := func() float64 {
		return metricOr0(t, tu.URL+"/metrics", "turnout_discovery_held_endpoints", `pool="chat_mixed"`)
	}
	api := c.Admin.DiscoveryV1().EndpointSlices("llm")
	ctx := context.Background()
	del := func() {
		for _, name := range []string{"vllm-a", "vllm-b"} {
			if err := api.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}

	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	lctx, stop := context.WithCancel(ctx)
	defer stop()
	load := &kubeLoad{name: "haproxy", model: "chat"}
	load.run(lctx, client, h.URL+"/v1/chat/completions", 12, 100*time.Millisecond) // <= 120 req/s
	start := time.Now()
	time.Sleep(2 * time.Second)

	del()
	deleted := time.Now()
	Eventually(t, 3*time.Second, "the kept endpoints marked", func() bool {
		return held() == 2 && strings.Contains(getBody(t, tu.URL+"/readyz?verbose"), "pool chat_mixed: every EndpointSlice vanished")
	})
	if res, err := http.Get(tu.URL + "/readyz"); err != nil || res.StatusCode != 200 {
		t.Errorf("/readyz while the endpoints are kept: %v %v", err, res)
	} else {
		res.Body.Close()
	}
	time.Sleep(time.Until(deleted.Add(2500 * time.Millisecond)))
	// Re-created (the controller names new slices differently).
	putSlice(t, c, chatSlice("vllm-x", 0, 1))
	t.Logf("slices re-created %v after they were deleted", time.Since(deleted).Round(time.Millisecond))
	Eventually(t, 3*time.Second, "the pool following its slices again", func() bool { return held() == 0 })
	time.Sleep(2 * time.Second)
	stop()
	load.wg.Wait()
	total := load.ok.Load() + load.fail.Load()
	t.Logf("slices deleted and re-created under load: %d ok, %d failed in %v (%.0f req/s)", load.ok.Load(), load.fail.Load(),
		time.Since(start).Round(time.Second), float64(total)/time.Since(start).Seconds())
	if load.fail.Load() > 0 {
		t.Errorf("%d requests failed while the slices were re-created within the grace, e.g. %v", load.fail.Load(), load.failures)
	}
	for _, m := range ms {
		if m.Stats().Requests == 0 {
			t.Errorf("%s got no requests", m.Name)
		}
	}
	st := h.ServerStatus(t)
	for _, id := range []string{"chat_mixed/m-0", "chat_mixed/m-1"} {
		if st[id] != "UP" {
			t.Errorf("%s is %q after the slices came back", id, st[id])
		}
	}

	// Gone for longer than the grace: the endpoints leave the pool and HAProxy.
	if err := api.Delete(ctx, "vllm-x", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deleted = time.Now()
	Eventually(t, 15*time.Second, "the servers deleted from HAProxy after the grace", func() bool {
		st := h.ServerStatus(t)
		_, ok0 := st["chat_mixed/m-0"]
		_, ok1 := st["chat_mixed/m-1"]
		return !ok0 && !ok1
	})
	if d := time.Since(deleted); d < 5500*time.Millisecond {
		t.Errorf("servers left %v after the slices vanished, before the 6s grace", d)
	}
	if held() != 0 {
		t.Errorf("turnout_discovery_held_endpoints = %v after the grace", held())
	}
	b, _ := os.ReadFile(tu.Log)
	if !strings.Contains(string(b), "vanish grace over") {
		t.Error("no log line for the end of the grace")
	}
}

// TestKubeExpiredDrainNoWait (issue 28 item 9): a pod leaves its slice
// with a stream open on it; at haproxy.drain_timeout (2s) turnout drops it
// and HAProxy closes its sessions at once instead of draining it a second
// time, so a pod added just after appears within the usual change latency
// (the sync does not wait on the expired drain).
func TestKubeExpiredDrainNoWait(t *testing.T) {
	if !inNetns(t) {
		return
	}
	NeedHAProxy(t)
	c := kubetest.Start(t, repoRoot(), "llm", "10.244.0.1")
	putSlice(t, c, chatSlice("vllm-a", 0, 1))
	tu, h, _ := kubeChatStack(t, c, ", drain_timeout: 2s", 3)
	h.WaitServersUp(t, "chat_mixed/m-0", "chat_mixed/m-1")
	WaitHTTP(t, tu.URL+"/readyz", 10*time.Second)
	ctx := context.Background()
	client := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

	// Long streams (10 ms per token, 2,000 tokens: 20 s) until one is on m-1.
	type res struct {
		replica string
		end     time.Time
		err     error
	}
	done := make(chan res, 16)
	onM1 := 0
	for i := 0; i < 8 && onM1 == 0; i++ {
		opened := make(chan string, 1)
		go func() {
			got, err := kubeStream(ctx, client, h.URL+"/v1/chat/completions", kubeChat("chat", fmt.Sprintf("long %d", i), 2000), func(r string) { opened <- r })
			done <- res{got.replica, time.Now(), err}
		}()
		select {
		case r := <-opened:
			if r == "m-1" {
				onM1++
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a long stream did not start")
		}
	}
	if onM1 == 0 {
		t.Fatal("no long stream landed on m-1")
	}

	putSlice(t, c, chatSlice("vllm-a", 0))
	left := time.Now()
	Eventually(t, 5*time.Second, "m-1 draining", func() bool { return strings.HasPrefix(h.ServerStatus(t)["chat_mixed/m-1"], "DRAIN") })
	// The drain expires at 2s (the fleet re-checks every 200 ms); the old
	// HAProxy sync then waited another drain_timeout for m-1's sessions.
	time.Sleep(time.Until(left.Add(2600 * time.Millisecond)))
	putSlice(t, c, chatSlice("vllm-a", 0, 2))
	added := time.Now()
	Eventually(t, 10*time.Second, "m-2 in HAProxy", func() bool {
		st, ok := h.ServerStatus(t)["chat_mixed/m-2"]
		return ok && !strings.HasPrefix(st, "MAINT")
	})
	wait := time.Since(added)
	t.Logf("m-2 in HAProxy %v after its slice was written (%v after m-1 left with a stream open, drain_timeout 2s)",
		wait.Round(time.Millisecond), time.Since(left).Round(time.Millisecond))
	if wait > time.Second {
		t.Errorf("m-2 appeared %v after its slice change: the sync waited on m-1's expired drain", wait)
	}
	Eventually(t, 5*time.Second, "m-1 deleted from HAProxy", func() bool {
		_, ok := h.ServerStatus(t)["chat_mixed/m-1"]
		return !ok
	})
	// The stream on m-1 was closed at the drain timeout, not a second one later.
	for range onM1 {
		for {
			r := <-done
			if r.replica != "m-1" {
				continue
			}
			if d := r.end.Sub(left); d > 3500*time.Millisecond {
				t.Errorf("the stream on m-1 ended %v after m-1 left (drain_timeout 2s): drained twice", d)
			}
			if r.err == nil {
				t.Errorf("the stream on m-1 finished (20 s) instead of being cut at the drain timeout")
			}
			break
		}
	}
}
