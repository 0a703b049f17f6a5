//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/turnout/turnout/lab/mock"
	"github.com/turnout/turnout/lab/testenv/kubetest"
	"github.com/turnout/turnout/nginx"
)

// netnsEnv marks the child test process that runs inside its own network
// namespace: EndpointSlice validation rejects loopback addresses, so the
// mock replicas listen on 10.244.0.N addresses on the namespace's lo.
const netnsEnv = "TURNOUT_E2E_NETNS"

// kubeLoadEnv makes TestKubeFleet keep its load running for at least that
// long (the figure is 30s at >= 100 req/s) and then require the rate.
const kubeLoadEnv = "TURNOUT_KUBE_LOAD"

// inNetns re-runs the named test in a private network namespace (unshare
// -n) with 10.244.0.1-40/32 on lo and reports its result; it returns false
// in the parent, true in the child (which then runs the test body).
func inNetns(t *testing.T) bool {
	if os.Getenv(netnsEnv) == "1" {
		return true
	}
	kubetest.Binaries(t)
	if _, err := exec.LookPath("unshare"); err != nil {
		kubetest.Skip(t, "unshare (util-linux) not installed: skipping Kubernetes end-to-end test")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		kubetest.Skip(t, "ip (iproute2) not installed: skipping Kubernetes end-to-end test")
	}
	if err := exec.Command("unshare", "-n", "true").Run(); err != nil {
		kubetest.Skip(t, fmt.Sprintf("cannot create a network namespace (unshare -n: %v; needs root or CAP_SYS_ADMIN): skipping Kubernetes end-to-end test", err))
	}
	bin := TurnoutBin(t) // built once, outside
	script := `set -e; ip link set lo up; i=1; while [ $i -le 40 ]; do ip addr add 10.244.0.$i/32 dev lo; i=$((i+1)); done; exec "$@"`
	cmd := exec.Command("unshare", "-n", "sh", "-c", script, "sh", os.Args[0],
		"-test.run", "^"+t.Name()+"$", "-test.v", "-test.count=1", "-test.timeout=8m")
	cmd.Env = append(os.Environ(), netnsEnv+"=1", "TURNOUT_BIN="+bin)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	t.Logf("---- %s in its network namespace ----\n%s", t.Name(), out.String())
	if err != nil {
		t.Fatalf("%s failed in its network namespace: %v", t.Name(), err)
	}
	if strings.Contains(out.String(), "--- SKIP") {
		kubetest.Skip(t, "skipped inside the network namespace (see log)")
	}
	return false
}

// kubeMock starts a mock replica on ip:8000.
func kubeMock(t *testing.T, name, ip string, role mock.Role) *Mock {
	t.Helper()
	cfg := mock.DefaultConfig()
	cfg.Name = name
	cfg.Role = role
	cfg.TimeScale = 0.5 // 10 ms per token: streams overlap the membership changes
	l := zerolog.Nop()
	s, err := mock.New(cfg, &l)
	if err != nil {
		t.Fatal(err)
	}
	url, err := s.Start(ip + ":8000")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return &Mock{Server: s, Name: name, Addr: strings.TrimPrefix(url, "http://")}
}

func kptr[T any](v T) *T { return &v }

func kubeEP(pod, ip string, ready, terminating bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{
		Addresses:  []string{ip},
		Conditions: discoveryv1.EndpointConditions{Ready: kptr(ready && !terminating), Serving: kptr(ready), Terminating: kptr(terminating)},
		TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "llm", Name: pod},
	}
}

// kubeSSE is one streamed answer as the client saw it.
type kubeSSE struct {
	status  int
	replica string
	content int
	done    bool
}

// kubeStream posts body and reads the event stream to its end; opened (if
// not nil) gets the replica once the response headers arrived.
func kubeStream(ctx context.Context, c *http.Client, url string, body []byte, opened func(string)) (kubeSSE, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return kubeSSE{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	// An nginx worker leaving after a reload closes its idle keep-alive
	// connections; a request written into one at that moment was never
	// read. The Idempotency-Key (the openai SDKs send one too) lets Go's
	// transport resend exactly those requests (as in nginx_cases_test.go).
	req.Header.Set("Idempotency-Key", fmt.Sprintf("%p-%d", req, time.Now().UnixNano()))
	res, err := c.Do(req)
	if err != nil {
		return kubeSSE{}, err
	}
	defer res.Body.Close()
	out := kubeSSE{status: res.StatusCode, replica: res.Header.Get(mock.HeaderReplica)}
	if opened != nil {
		opened(out.replica)
	}
	if res.StatusCode != 200 {
		b, _ := io.ReadAll(res.Body)
		return out, fmt.Errorf("status %d: %s", res.StatusCode, b)
	}
	ev, err := readChatEvents(res.Body)
	out.content, out.done = ev.content, ev.done
	return out, err
}

func kubeChat(model, user string, maxTokens int) []byte {
	return fmt.Appendf(nil, `{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":%d,"stream":true}`, model, user, maxTokens)
}

const kubeDecodeBase = 21 // d-i listens on 10.244.0.(21+i)

// pdSlice is the vllm-pd Service's slice: p-0 and decode d-0..d-(n-1),
// with the listed decode replicas terminating.
func pdSlice(n int, terminating ...int) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "vllm-pd-a", Labels: map[string]string{discoveryv1.LabelServiceName: "vllm-pd"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: kptr("http"), Port: kptr(int32(8000))}},
		Endpoints:   []discoveryv1.Endpoint{kubeEP("p-0", "10.244.0.20", true, false)},
	}
	for i := range n {
		term := false
		for _, j := range terminating {
			term = term || i == j
		}
		es.Endpoints = append(es.Endpoints, kubeEP(fmt.Sprintf("d-%d", i), fmt.Sprintf("10.244.0.%d", kubeDecodeBase+i), true, term))
	}
	return es
}

// putSlice creates or updates es.
func putSlice(t *testing.T, c *kubetest.Cluster, es *discoveryv1.EndpointSlice) {
	t.Helper()
	ctx := context.Background()
	api := c.Admin.DiscoveryV1().EndpointSlices(c.Namespace)
	cur, err := api.Get(ctx, es.Name, metav1.GetOptions{})
	if err == nil {
		es.ResourceVersion = cur.ResourceVersion
		_, err = api.Update(ctx, es, metav1.UpdateOptions{})
	} else {
		_, err = api.Create(ctx, es, metav1.CreateOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
}

// kubeLoad is steady streaming load on the PD and mixed models through
// one proxy, checking every answer to its last event.
type kubeLoad struct {
	name     string
	model    string // "" = PD, every fourth request chat
	ok, fail atomic.Int64
	mu       sync.Mutex
	failures []string
	first    map[string]time.Time // replica -> first response headers
	wg       sync.WaitGroup
}

const kubeLoadTokens = 8

func (l *kubeLoad) run(ctx context.Context, c *http.Client, url string, workers int, every time.Duration) {
	l.first = map[string]time.Time{}
	for w := range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			tick := time.NewTicker(every)
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				model := "pd"
				if i%4 == 3 {
					model = "chat"
				}
				if l.model != "" {
					model = l.model
				}
				got, err := kubeStream(context.Background(), c, url, kubeChat(model, fmt.Sprintf("%s w%d-%d", l.name, w, i), kubeLoadTokens), func(r string) {
					now := time.Now()
					l.mu.Lock()
					if _, ok := l.first[r]; !ok {
						l.first[r] = now
					}
					l.mu.Unlock()
				})
				if err == nil && (got.content != kubeLoadTokens || !got.done) {
					err = fmt.Errorf("truncated: %d/%d content events, [DONE] %v from %s", got.content, kubeLoadTokens, got.done, got.replica)
				}
				if err == nil {
					l.ok.Add(1)
					continue
				}
				l.fail.Add(1)
				l.mu.Lock()
				if len(l.failures) < 5 {
					l.failures = append(l.failures, fmt.Sprintf("%s %s: %v", time.Now().Format("15:04:05.000"), model, err))
				}
				l.mu.Unlock()
			}
		}()
	}
}

func (l *kubeLoad) firstSeen(replica string) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t, ok := l.first[replica]
	return t, ok
}

// TestKubeFleet: turnout follows EndpointSlices from a real API server
// (with the Role of deploy/kubernetes only) and keeps HAProxy and nginx in
// line while streaming PD and mixed load runs through both: decode scales
// 2 -> 6 -> 2 (HAProxy over the runtime API, nginx routing to turnout's
// addresses: neither reloads), a decode pod turns
// terminating with streams open on it, the API server is away for 10 s,
// and slices with bad content arrive.
func TestKubeFleet(t *testing.T) {
	if !inNetns(t) {
		return
	}
	NeedHAProxy(t)
	NeedNginx(t)
	minLoad, _ := time.ParseDuration(os.Getenv(kubeLoadEnv))
	c := kubetest.Start(t, repoRoot(), "llm", "10.244.0.1")
	ctx := context.Background()

	chat := []*Mock{kubeMock(t, "m-0", "10.244.0.10", mock.RoleMixed), kubeMock(t, "m-1", "10.244.0.11", mock.RoleMixed)}
	pre := kubeMock(t, "p-0", "10.244.0.20", mock.RolePrefill)
	var dec []*Mock
	for i := range 6 {
		dec = append(dec, kubeMock(t, fmt.Sprintf("d-%d", i), fmt.Sprintf("10.244.0.%d", kubeDecodeBase+i), mock.RoleDecode))
	}
	// One Service feeds both PD pools; the pods' vllm-role label sorts them.
	pods := map[string]string{"p-0": "prefill"}
	for _, m := range dec {
		pods[m.Name] = "decode"
	}
	for name, role := range pods {
		if _, err := c.Admin.CoreV1().Pods("llm").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"vllm-role": role}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "v", Image: "vllm"}}, AutomountServiceAccountToken: kptr(false)},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	putSlice(t, c, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "vllm-chat-a", Labels: map[string]string{discoveryv1.LabelServiceName: "vllm-chat", "app": "vllm"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: kptr("http"), Port: kptr(int32(8000))}},
		Endpoints:   []discoveryv1.Endpoint{kubeEP("m-0", "10.244.0.10", true, false), kubeEP("m-1", "10.244.0.11", true, false)},
	})
	putSlice(t, c, pdSlice(2))

	hdir, ndir := t.TempDir(), t.TempDir()
	tAddr, hAddr, nAddr, syslog := FreeAddr(t), FreeAddr(t), FreeAddr(t), FreeUDPAddr(t)
	cfg := fmt.Sprintf(`listen: %s
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
        discovery: {kubernetes: {namespace: llm, label_selector: "app=vllm", port: http}}
  - name: pd
    models: [pd]
    policy: {name: round-robin}
    pd: {prefill_timeout: 5s}
    pools:
      - role: prefill
        discovery: {kubernetes: {namespace: llm, service: vllm-pd, port: http, role_label: vllm-role}}
      - role: decode
        discovery: {kubernetes: {namespace: llm, service: vllm-pd, port: "8000", role_label: vllm-role}}
`, tAddr, syslog, hAddr, hdir, nAddr, ndir)
	tu := StartTurnout(t, tAddr, cfg, "--haproxy-dir", hdir, "--nginx-dir", ndir, "--nginx-user", "root",
		"--kubeconfig", c.Kubeconfig(kubetest.TurnoutToken), "--watch", "100ms")
	Eventually(t, 30*time.Second, "turnout to write haproxy.cfg and nginx.conf", func() bool {
		_, err1 := os.Stat(filepath.Join(hdir, "haproxy.cfg"))
		_, err2 := os.Stat(filepath.Join(ndir, nginx.ConfigFile))
		return err1 == nil && err2 == nil
	})
	h := StartHAProxy(t, hdir, hAddr)
	h.WaitServersUp(t, "chat_mixed/m-0", "chat_mixed/m-1", "pd_prefill/p-0", "pd_decode/d-0", "pd_decode/d-1")
	n := StartNginx(t, ndir, nAddr)
	WaitHTTP(t, tu.URL+"/readyz", 10*time.Second)
	haMaster, haWorker := h.Cmd.Process.Pid, h.Info(t)["Pid"]
	ngMaster := n.Cmd.Process.Pid
	logCount := func(msg string) int {
		b, _ := os.ReadFile(tu.Log)
		return strings.Count(string(b), msg)
	}

	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	// 1. PD and mixed requests flow through both proxies.
	for _, url := range []string{h.URL, n.URL} {
		for _, model := range []string{"pd", "chat"} {
			got, err := kubeStream(ctx, client, url+"/v1/chat/completions", kubeChat(model, "hello "+model, 4), nil)
			if err != nil || got.content != 4 || !got.done {
				t.Fatalf("%s via %s: %v %+v", model, url, err, got)
			}
			want := "m-"
			if model == "pd" {
				want = "d-"
			}
			if !strings.HasPrefix(got.replica, want) {
				t.Errorf("%s via %s answered by %q", model, url, got.replica)
			}
		}
	}
	if pre.Stats().Requests == 0 {
		t.Fatalf("PD requests ran no prefill on p-0")
	}
	ngReloads := logCount("reloading nginx")

	// Steady streaming load through both proxies for the whole test.
	lctx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	haLoad, ngLoad := &kubeLoad{name: "haproxy"}, &kubeLoad{name: "nginx"}
	haLoad.run(lctx, client, h.URL+"/v1/chat/completions", 12, 100*time.Millisecond) // <= 120 req/s
	ngLoad.run(lctx, client, n.URL+"/v1/chat/completions", 4, 100*time.Millisecond)  // <= 40 req/s
	loadStart := time.Now()
	time.Sleep(2 * time.Second)

	// 2. Scale decode 2 -> 6: each new replica answers within 1 s of becoming ready.
	putSlice(t, c, pdSlice(6))
	readyAt := time.Now()
	for _, m := range dec[2:] {
		Eventually(t, 10*time.Second, m.Name+" answers through HAProxy", func() bool { _, ok := haLoad.firstSeen(m.Name); return ok })
		at, _ := haLoad.firstSeen(m.Name)
		t.Logf("scale-up: %s answered through HAProxy %v after its slice said ready", m.Name, at.Sub(readyAt).Round(time.Millisecond))
		if d := at.Sub(readyAt); d > time.Second {
			t.Errorf("%s answered %v after becoming ready, want <= 1s", m.Name, d)
		}
	}
	for _, m := range dec[2:] {
		Eventually(t, 10*time.Second, m.Name+" answers through nginx", func() bool { _, ok := ngLoad.firstSeen(m.Name); return ok })
	}
	if got := logCount("reloading nginx"); got != ngReloads {
		t.Errorf("nginx reloaded %d times for new replicas (it routes to turnout's addresses)", got-ngReloads)
	}

	// 3. d-5 turns terminating with long streams open on it: no new decision
	// goes to it after 1 s, HAProxy drains it, the open streams finish, and
	// nginx does not reload (its upstream set did not change).
	const longTokens = 150 // 1.5 s at 10 ms per token
	type longRes struct {
		got kubeSSE
		err error
	}
	var long []chan longRes
	opened := make(chan string, 64)
	for i := 0; i < 60 && len(long) < 30; i++ {
		ch := make(chan longRes, 1)
		long = append(long, ch)
		url := h.URL
		if i%2 == 1 {
			url = n.URL
		}
		go func() {
			sent := false
			got, err := kubeStream(ctx, client, url+"/v1/chat/completions", kubeChat("pd", fmt.Sprintf("long %d", i), longTokens), func(r string) {
				sent = true
				opened <- r
			})
			if !sent {
				opened <- ""
			}
			ch <- longRes{got, err}
		}()
	}
	onD5 := 0
	for range long {
		if <-opened == "d-5" {
			onD5++
		}
	}
	if onD5 == 0 {
		t.Fatal("no long stream landed on d-5")
	}
	putSlice(t, c, pdSlice(6, 5))
	termAt := time.Now()
	// "DRAIN 1/2" while its health checks still rise: drained all the same.
	Eventually(t, 5*time.Second, "pd_decode/d-5 in DRAIN", func() bool {
		return strings.HasPrefix(h.ServerStatus(t)["pd_decode/d-5"], "DRAIN")
	})
	t.Logf("terminating: pd_decode/d-5 in DRAIN %v after its slice said terminating", time.Since(termAt).Round(time.Millisecond))
	time.Sleep(time.Until(termAt.Add(time.Second)))
	n5 := dec[5].Stats().Requests
	for _, ch := range long {
		r := <-ch
		if r.err != nil || r.got.content != longTokens || !r.got.done {
			t.Errorf("long stream on %s: %v, %d/%d content events, [DONE] %v", r.got.replica, r.err, r.got.content, longTokens, r.got.done)
		}
	}
	time.Sleep(500 * time.Millisecond)
	if got := dec[5].Stats().Requests; got != n5 {
		t.Errorf("terminating d-5 got %d new requests more than 1s after it turned terminating", got-n5)
	}
	t.Logf("terminating: %d long streams were open on d-5 and finished", onD5)
	if got := logCount("reloading nginx"); got != ngReloads {
		t.Errorf("nginx reloaded %d times for a terminating pod (its upstream set did not change)", got-ngReloads)
	}

	// 4. Scale down 6 -> 2: the servers leave HAProxy (runtime API) and nginx.
	putSlice(t, c, pdSlice(2))
	Eventually(t, 20*time.Second, "servers d-2..d-5 deleted from HAProxy", func() bool {
		st := h.ServerStatus(t)
		for _, m := range dec[2:] {
			if _, ok := st["pd_decode/"+m.Name]; ok {
				return false
			}
		}
		return true
	})
	time.Sleep(time.Second)
	before := make([]int64, len(dec))
	for i, m := range dec {
		before[i] = m.Stats().Requests
	}
	time.Sleep(time.Second)
	for i := 2; i < len(dec); i++ {
		if got := dec[i].Stats().Requests; got != before[i] {
			t.Errorf("%s got %d requests after it left the slice", dec[i].Name, got-before[i])
		}
	}
	ngReloads = logCount("reloading nginx")

	// 5. The API server is away for 10 s: turnout keeps the last known set,
	// says so, stays ready; after the restart it resyncs and a change arrives.
	decisions := func(ep string) float64 {
		v, err := Metric(t, tu.URL+"/metrics", "turnout_endpoint_decisions_total", `endpoint="`+ep+`"`)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	d0 := decisions("d-0")
	c.StopAPI()
	outage := time.Now()
	for time.Since(outage) < 10*time.Second {
		res, err := http.Get(tu.URL + "/readyz")
		if err != nil || res.StatusCode != 200 {
			t.Fatalf("turnout not ready during the API outage: %v %v", err, res)
		}
		res.Body.Close()
		time.Sleep(250 * time.Millisecond)
	}
	c.StartAPI()
	t.Logf("API server back after %v", time.Since(outage).Round(time.Millisecond))
	Eventually(t, 30*time.Second, "turnout to log the outage and the resync", func() bool {
		return logCount("keeping the last known endpoints") > 0 && logCount("kubernetes API reachable again") > 0 && logCount("endpointslices resynced") > 0
	})
	putSlice(t, c, pdSlice(3))
	h.WaitServersUp(t, "pd_decode/d-2")
	for _, id := range []string{"chat_mixed/m-0", "chat_mixed/m-1", "pd_prefill/p-0", "pd_decode/d-0", "pd_decode/d-1"} {
		if st := h.ServerStatus(t)[id]; st != "UP" {
			t.Errorf("%s is %q after the outage", id, st)
		}
	}
	if d := decisions("d-0"); d < d0 {
		t.Errorf("d-0's decision counter went from %v to %v: endpoint state lost across the resync", d0, d)
	}
	if got := logCount("reloading nginx"); got != ngReloads {
		t.Errorf("nginx reloaded %d times for d-2's return", got-ngReloads)
	}

	// 6. Bad input: a slice without the named port, an IPv6 slice and a
	// duplicate address add nothing; the good endpoints keep serving.
	bad := pdSlice(0)
	bad.Name, bad.Ports[0].Name, bad.Ports[0].Port = "vllm-pd-noport", kptr("grpc"), kptr(int32(9000))
	bad.Endpoints = []discoveryv1.Endpoint{kubeEP("d-4", "10.244.0.25", true, false)}
	putSlice(t, c, bad)
	v6 := pdSlice(0)
	v6.Name, v6.AddressType = "vllm-pd-v6", discoveryv1.AddressTypeIPv6
	v6.Endpoints = []discoveryv1.Endpoint{kubeEP("d-5", "fd00::26", true, false)}
	putSlice(t, c, v6)
	dup := pdSlice(0)
	dup.Name = "vllm-pd-dup"
	dup.Endpoints = []discoveryv1.Endpoint{kubeEP("d-3", "10.244.0.21", true, false)} // d-0's address
	putSlice(t, c, dup)
	Eventually(t, 10*time.Second, "turnout to log the bad slices", func() bool {
		return logCount(`"reason":"no port`) > 0 && logCount("duplicate address skipped") > 0
	})
	time.Sleep(time.Second)
	st := h.ServerStatus(t)
	for _, m := range dec[3:] {
		if _, ok := st["pd_decode/"+m.Name]; ok {
			t.Errorf("%s was added from a bad slice", m.Name)
		}
	}
	if got := logCount("reloading nginx"); got != ngReloads {
		t.Errorf("nginx reloaded %d times for slices that changed nothing", got-ngReloads)
	}

	if rest := minLoad - time.Since(loadStart); rest > 0 {
		t.Logf("keeping the load on for %v more (%s=%v)", rest.Round(time.Second), kubeLoadEnv, minLoad)
		time.Sleep(rest)
	}
	elapsed := time.Since(loadStart)
	stopLoad()
	haLoad.wg.Wait()
	ngLoad.wg.Wait()
	for _, l := range []*kubeLoad{haLoad, ngLoad} {
		total := l.ok.Load() + l.fail.Load()
		rate := float64(total) / elapsed.Seconds()
		t.Logf("load via %s: %d ok, %d failed or truncated in %v (%.0f req/s)", l.name, l.ok.Load(), l.fail.Load(), elapsed.Round(time.Second), rate)
		if l.fail.Load() > 0 {
			t.Errorf("via %s: %d failed or truncated requests, e.g. %v", l.name, l.fail.Load(), l.failures)
		}
		if l == haLoad && minLoad > 0 && rate < 100 {
			t.Errorf("load via HAProxy ran at %.0f req/s, below the 100 req/s %s asks for", rate, kubeLoadEnv)
		}
	}
	if h.Cmd.Process.Pid != haMaster || h.Info(t)["Pid"] != haWorker {
		t.Errorf("HAProxy reloaded: master %d, worker %s -> %s", haMaster, haWorker, h.Info(t)["Pid"])
	}
	if got := logCount("reloading HAProxy"); got != 0 {
		t.Errorf("turnout reloaded HAProxy %d times", got)
	}
	if n.Cmd.Process.Pid != ngMaster || n.Exited() {
		t.Errorf("nginx master changed or exited")
	}
	for _, m := range chat {
		if m.Stats().Requests == 0 {
			t.Errorf("mixed replica %s got no requests", m.Name)
		}
	}
	t.Logf("turnout reloaded nginx %d times, HAProxy 0 times", logCount("reloading nginx"))
}

// TestKubeRBACDenied: a turnout whose token has no Role says so at start
// and stays not ready; nothing is routed.
func TestKubeRBACDenied(t *testing.T) {
	kubetest.Binaries(t)
	c := kubetest.Start(t, repoRoot(), "llm", "")
	addr := FreeAddr(t)
	tu := StartTurnout(t, addr, fmt.Sprintf(`listen: %s
health: {disable: true}
feedback: {disable: true}
deployments:
  - name: chat
    pools:
      - role: mixed
        discovery: {kubernetes: {namespace: llm, service: vllm-chat, port: http}}
`, addr), "--kubeconfig", c.Kubeconfig(kubetest.NobodyToken))
	Eventually(t, 20*time.Second, "a clear RBAC error in the log", func() bool {
		b, _ := os.ReadFile(tu.Log)
		return strings.Contains(string(b), "forbidden") && strings.Contains(string(b), "kubernetes discovery cannot list")
	})
	res, err := http.Get(tu.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/readyz = %d, want 503", res.StatusCode)
	}
	r, err := Post(context.Background(), http.DefaultClient, tu.URL+"/internal/route", []byte(`{"model":"chat","prompt":"x"}`), nil)
	if err != nil || r.Status != http.StatusServiceUnavailable {
		t.Errorf("route without endpoints: %v %+v, want 503", err, r)
	}
	if tu.Exited() {
		t.Error("turnout exited")
	}
}

// TestKubeBadSelector: a label selector that does not parse is a config
// error naming the field, at start.
func TestKubeBadSelector(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.yaml")
	if err := os.WriteFile(path, []byte(fmt.Sprintf(`listen: %s
feedback: {disable: true}
deployments:
  - name: chat
    pools:
      - role: mixed
        discovery: {kubernetes: {label_selector: "app in (vllm", port: http}}
`, FreeAddr(t))), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(TurnoutBin(t), "serve", "--config", path).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "deployments[0].pools[0].discovery.kubernetes.label_selector") {
		t.Fatalf("want a config error naming the field, got %v:\n%s", err, out)
	}
}
