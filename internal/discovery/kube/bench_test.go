package kube_test

// Benchmarks of Kubernetes discovery against a real kube-apiserver + etcd
// (internal/kubetest), the turnout binary and a real HAProxy (BENCHMARKS.md,
// "Kubernetes discovery"). Each runs in a private network namespace
// (unshare -n): the discovered endpoints have 10.244.x addresses, and the
// health checks of turnout and HAProxy must not leave the machine. They skip
// when etcd, kube-apiserver, haproxy or unshare is missing.
//
//	go test ./internal/discovery/kube -run '^$' -bench . -benchtime 1x

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/turnout/turnout/internal/discovery/kube"
	"github.com/turnout/turnout/internal/kubetest"
	"github.com/turnout/turnout/route"
)

const (
	benchNS     = "llm"
	netnsEnv    = "TURNOUT_KUBE_BENCH_NETNS" // set in the child that runs inside the namespace
	resultEnv   = "TURNOUT_KUBE_BENCH_OUT"   // where the child writes its metrics (JSON)
	turnoutEnv  = "TURNOUT_BIN"              // a built turnout; else the benchmark builds one
	benchRepo   = "../../.."
	advertise   = "10.244.0.1" // the API server needs an address besides loopback to advertise
	sliceSize   = 100          // the EndpointSlice controller's default maxEndpointsPerSlice
	changeCount = 100
)

// inNetns runs the calling benchmark again in a private network namespace
// and reports the metrics the child measured; it returns true in the child.
func inNetns(b *testing.B, needHAProxy bool) bool {
	b.Helper()
	if os.Getenv(netnsEnv) == "1" {
		return true
	}
	kubetest.Binaries(b)
	if needHAProxy {
		if _, err := exec.LookPath("haproxy"); err != nil {
			b.Skip("haproxy not installed (apt-get install haproxy): skipping")
		}
	}
	if err := exec.Command("unshare", "-n", "true").Run(); err != nil {
		b.Skipf("cannot create a network namespace (unshare -n: %v; needs root or CAP_SYS_ADMIN): skipping", err)
	}
	bin := turnoutBin(b)
	out := filepath.Join(b.TempDir(), "metrics.json")
	cmd := exec.Command("unshare", "-n", "sh", "-c", `set -e; ip link set lo up; ip addr add `+advertise+`/32 dev lo; exec "$@"`, "sh", os.Args[0],
		"-test.run", "^$", "-test.bench", "^"+b.Name()+"$", "-test.benchtime", "1x", "-test.v", "-test.timeout", "10m")
	cmd.Env = append(os.Environ(), netnsEnv+"=1", resultEnv+"="+out, turnoutEnv+"="+bin)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	b.StopTimer()
	err := cmd.Run()
	if err != nil || bytes.Contains(log.Bytes(), []byte("--- SKIP")) {
		b.Logf("---- %s in its network namespace ----\n%s", b.Name(), log.String())
	}
	if err != nil {
		b.Fatalf("%s failed in its network namespace: %v", b.Name(), err)
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		b.Skip("no metrics from the network namespace (skipped there, see log)")
	}
	var m map[string]float64
	if err := json.Unmarshal(raw, &m); err != nil {
		b.Fatal(err)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		b.ReportMetric(m[k], k)
	}
	return false
}

// report records the child's metrics for the parent.
func report(b *testing.B, m map[string]float64) {
	b.Helper()
	raw, _ := json.Marshal(m)
	if err := os.WriteFile(os.Getenv(resultEnv), raw, 0o644); err != nil {
		b.Fatal(err)
	}
}

// turnoutBin returns $TURNOUT_BIN or builds cmd/turnout once per run.
func turnoutBin(b *testing.B) string {
	b.Helper()
	if p := os.Getenv(turnoutEnv); p != "" {
		return p
	}
	p := filepath.Join(os.TempDir(), fmt.Sprintf("turnout-kube-bench-%d", os.Getpid()))
	if _, err := os.Stat(p); err == nil {
		return p
	}
	cmd := exec.Command("go", "build", "-o", p, "./cmd/turnout")
	cmd.Dir = benchRepo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("build turnout: %v\n%s", err, out)
	}
	b.Cleanup(func() { _ = os.Remove(p) })
	return p
}

func freeAddr(b *testing.B) string {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// proc starts a process owned by the benchmark and stops it (by its PID)
// at the end.
func proc(b *testing.B, dir, name, bin string, args ...string) *exec.Cmd {
	b.Helper()
	f, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		b.Fatalf("start %s: %v", name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); f.Close(); close(done) }()
	b.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if b.Failed() {
			raw, _ := os.ReadFile(filepath.Join(dir, name+".log"))
			b.Logf("---- %s log (tail) ----\n%s", name, raw[max(0, len(raw)-4096):])
		}
	})
	return cmd
}

func poll(b *testing.B, timeout time.Duration, what string, ok func() bool) {
	b.Helper()
	deadline := time.Now().Add(timeout)
	for !ok() {
		if time.Now().After(deadline) {
			b.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func bptr[T any](v T) *T { return &v }

func benchEP(pod, ip string, ready, terminating bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{
		Addresses:  []string{ip},
		Conditions: discoveryv1.EndpointConditions{Ready: bptr(ready), Serving: bptr(ready || terminating), Terminating: bptr(terminating)},
		TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: benchNS, Name: pod},
	}
}

func benchSlice(name string, eps []discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: benchNS, Labels: map[string]string{discoveryv1.LabelServiceName: "vllm"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: bptr("http"), Port: bptr(int32(8000))}},
		Endpoints:   eps,
	}
}

// srvState is one server of "show servers state".
type srvState struct{ maint, drain bool }

// serversState reads backend's servers over HAProxy's admin socket.
func serversState(sock, backend string) (map[string]srvState, error) {
	c, err := net.DialTimeout("unix", sock, time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(c, "show servers state "+backend+"\n"); err != nil {
		return nil, err
	}
	m := map[string]srvState{}
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 19 || f[0] == "#" {
			continue
		}
		admin, _ := strconv.Atoi(f[6])
		// srv_admin_state (2.6): maintenance bits 0x27, drain bits 0x18.
		m[f[3]] = srvState{maint: admin&0x27 != 0, drain: admin&0x18 != 0}
	}
	return m, sc.Err()
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	i := int(float64(len(sorted)-1) * p)
	return sorted[i]
}

// BenchmarkKubeToHAProxy: 100 EndpointSlice writes (a pod becomes ready, then
// terminating, then goes away, in turn) and, for each, the time from the
// API write until HAProxy's runtime state shows it (server present and
// enabled, in drain, deleted). Path: API server -> client-go informer ->
// turnout's debounce window (50 ms) -> route.Server.Apply -> runtime API.
func BenchmarkKubeToHAProxy(b *testing.B) {
	if !inNetns(b, true) {
		return
	}
	c := kubetest.Start(b, benchRepo, benchNS, advertise)
	ctx := context.Background()
	api := c.Admin.DiscoveryV1().EndpointSlices(benchNS)
	base := []discoveryv1.Endpoint{benchEP("base-0", "10.244.1.1", true, false), benchEP("base-1", "10.244.1.2", true, false)}
	if _, err := api.Create(ctx, benchSlice("vllm-a", base), metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	hdir := filepath.Join(dir, "haproxy")
	listen, hlisten := freeAddr(b), freeAddr(b)
	cfg := fmt.Sprintf(`listen: %s
health: {interval: 1s, timeout: 200ms}
haproxy: {listen: %q, dir: %q, drain_timeout: 2s, nbthread: 1}
deployments:
  - name: chat
    models: [chat]
    pools:
      - role: mixed
        discovery: {kubernetes: {namespace: %s, service: vllm, port: http}}
`, listen, hlisten, hdir, benchNS)
	cfgPath := filepath.Join(dir, "turnout.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		b.Fatal(err)
	}
	proc(b, dir, "turnout", os.Getenv(turnoutEnv), "serve", "--config", cfgPath, "--haproxy-dir", hdir,
		"--kubeconfig", c.Kubeconfig(kubetest.TurnoutToken), "--log-level", "warn")
	poll(b, 30*time.Second, "haproxy.cfg", func() bool { _, err := os.Stat(filepath.Join(hdir, "haproxy.cfg")); return err == nil })
	haproxy, _ := exec.LookPath("haproxy")
	proc(b, dir, "haproxy", haproxy, "-f", filepath.Join(hdir, "haproxy.cfg"))
	sock := filepath.Join(hdir, "admin.sock")
	const backend = "chat_mixed"
	poll(b, 10*time.Second, "HAProxy with base-0 and base-1", func() bool {
		m, err := serversState(sock, backend)
		return err == nil && len(m) == 2
	})

	lat := make([]time.Duration, 0, changeCount)
	kind := []string{"ready", "terminating", "gone"}
	byKind := map[string][]time.Duration{}
	for i := range changeCount {
		pod := fmt.Sprintf("c-%d", i/3)
		ip := fmt.Sprintf("10.244.2.%d", 1+(i/3)%250)
		eps := slices.Clone(base)
		want := func(m map[string]srvState) bool { s, ok := m[pod]; return ok && !s.maint && !s.drain }
		switch i % 3 {
		case 1:
			eps = append(eps, benchEP(pod, ip, false, true))
			want = func(m map[string]srvState) bool { s, ok := m[pod]; return ok && s.drain }
		case 2:
			want = func(m map[string]srvState) bool { _, ok := m[pod]; return !ok }
		default:
			eps = append(eps, benchEP(pod, ip, true, false))
		}
		cur, err := api.Get(ctx, "vllm-a", metav1.GetOptions{})
		if err != nil {
			b.Fatal(err)
		}
		cur.Endpoints = eps
		t0 := time.Now()
		if _, err := api.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			b.Fatal(err)
		}
		for {
			m, err := serversState(sock, backend)
			if err == nil && want(m) {
				break
			}
			if time.Since(t0) > 10*time.Second {
				b.Fatalf("change %d (%s %s): HAProxy state not reflected after 10s: %v %v", i, pod, kind[i%3], m, err)
			}
			time.Sleep(2 * time.Millisecond)
		}
		d := time.Since(t0)
		lat = append(lat, d)
		byKind[kind[i%3]] = append(byKind[kind[i%3]], d)
		// Let the removal's drain bookkeeping settle before the next write,
		// so each change is measured on its own.
		time.Sleep(20 * time.Millisecond)
	}
	slices.Sort(lat)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	m := map[string]float64{
		"p50-ms": ms(percentile(lat, 0.50)), "p90-ms": ms(percentile(lat, 0.90)),
		"p99-ms": ms(percentile(lat, 0.99)), "max-ms": ms(lat[len(lat)-1]), "changes": float64(len(lat)),
	}
	for k, v := range byKind {
		slices.Sort(v)
		m[k+"-p50-ms"] = ms(percentile(v, 0.5))
	}
	report(b, m)
}

// BenchmarkKubeSync: a Service with 10 (baseline), 1,000 or 5,000 ready
// endpoints (slices of 100): how long the discovery source takes to list
// them and report every endpoint and the Go heap it holds; then the turnout
// binary with HAProxy sync (start to /metrics listing every endpoint and
// haproxy.cfg written), HAProxy loading that file, the latency of single
// changes (a pod appears, a pod goes) at this size, and turnout's RSS.
func BenchmarkKubeSync(b *testing.B) {
	for _, n := range []int{10, 1000, 5000} {
		b.Run(fmt.Sprintf("endpoints-%d", n), func(b *testing.B) {
			if !inNetns(b, true) {
				return
			}
			benchSync(b, n)
		})
	}
}

func benchSync(b *testing.B, n int) {
	c := kubetest.Start(b, benchRepo, benchNS, advertise)
	ctx := context.Background()
	api := c.Admin.DiscoveryV1().EndpointSlices(benchNS)
	for s := 0; s*sliceSize < n; s++ {
		var eps []discoveryv1.Endpoint
		for i := s * sliceSize; i < min(n, (s+1)*sliceSize); i++ {
			eps = append(eps, benchEP(fmt.Sprintf("vllm-%05d", i), fmt.Sprintf("10.%d.%d.%d", 100+i/62500, i/250%250, 1+i%250), true, false))
		}
		if _, err := api.Create(ctx, benchSlice(fmt.Sprintf("vllm-%03d", s), eps), metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	pools := fmt.Sprintf(`deployments:
  - name: chat
    models: [chat]
    pools:
      - role: mixed
        discovery: {kubernetes: {namespace: %s, service: vllm, port: http}}
`, benchNS)
	cfg, err := route.ParseConfig([]byte(pools))
	if err != nil {
		b.Fatal(err)
	}

	// The source alone, in this process, with turnout's Role.
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	t0 := time.Now()
	src := kube.New(kube.Options{Client: c.Client(kubetest.TurnoutToken)})
	if err := src.Configure(cfg); err != nil {
		b.Fatal(err)
	}
	var eps []route.EndpointConfig
	poll(b, time.Minute, "the source to list every endpoint", func() bool {
		eps = src.Endpoints()["chat_mixed"]
		return len(eps) == n
	})
	srcSync := time.Since(t0)
	t1 := time.Now()
	_ = src.Endpoints()
	endpointsCall := time.Since(t1)
	runtime.GC()
	runtime.ReadMemStats(&after)
	heap := float64(after.HeapAlloc) - float64(before.HeapAlloc)
	runtime.KeepAlive(eps)
	src.Close()

	// The turnout binary with HAProxy sync: from exec to /metrics listing
	// every endpoint and haproxy.cfg written (rendered, checked with
	// haproxy -c); then HAProxy loading it; then single changes at this size.
	dir := b.TempDir()
	hdir := filepath.Join(dir, "haproxy")
	listen, hlisten := freeAddr(b), freeAddr(b)
	path := filepath.Join(dir, "turnout.yaml")
	head := fmt.Sprintf("listen: %s\nhealth: {interval: 5s, timeout: 1s}\nhaproxy: {listen: %q, dir: %q, drain_timeout: 2s, nbthread: 1}\n", listen, hlisten, hdir)
	if err := os.WriteFile(path, []byte(head+pools), 0o644); err != nil {
		b.Fatal(err)
	}
	t2 := time.Now()
	cmd := proc(b, dir, "turnout", os.Getenv(turnoutEnv), "serve", "--config", path, "--haproxy-dir", hdir,
		"--kubeconfig", c.Kubeconfig(kubetest.TurnoutToken), "--log-level", "error")
	poll(b, 2*time.Minute, "turnout's /metrics to list every endpoint and haproxy.cfg", func() bool {
		_, err := os.Stat(filepath.Join(hdir, "haproxy.cfg"))
		return err == nil && metricLines(listen, "turnout_endpoint_up{") == n
	})
	binSync := time.Since(t2)
	haproxy, err := exec.LookPath("haproxy")
	if err != nil {
		b.Fatal(err)
	}
	t3 := time.Now()
	proc(b, dir, "haproxy", haproxy, "-f", filepath.Join(hdir, "haproxy.cfg"))
	sock := filepath.Join(hdir, "admin.sock")
	const backend = "chat_mixed"
	poll(b, 2*time.Minute, "HAProxy with every server", func() bool {
		m, err := serversState(sock, backend)
		return err == nil && len(m) == n
	})
	haStart := time.Since(t3)

	// 10 changes at this size: a pod in its own slice appears, then goes.
	var lat []time.Duration
	for i := range 10 {
		pod := fmt.Sprintf("extra-%d", i/2)
		t0 := time.Now()
		var want func(map[string]srvState) bool
		if i%2 == 0 {
			if _, err := api.Create(ctx, benchSlice("vllm-extra", []discoveryv1.Endpoint{benchEP(pod, "10.244.3.1", true, false)}), metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
			want = func(m map[string]srvState) bool { s, ok := m[pod]; return ok && !s.maint }
		} else {
			if err := api.Delete(ctx, "vllm-extra", metav1.DeleteOptions{}); err != nil {
				b.Fatal(err)
			}
			want = func(m map[string]srvState) bool { _, ok := m[pod]; return !ok }
		}
		for {
			m, err := serversState(sock, backend)
			if err == nil && want(m) {
				break
			}
			if time.Since(t0) > 30*time.Second {
				b.Fatalf("change %d (%s) not in HAProxy after 30s", i, pod)
			}
			time.Sleep(10 * time.Millisecond)
		}
		lat = append(lat, time.Since(t0))
	}
	slices.Sort(lat)
	time.Sleep(2 * time.Second) // a few health rounds: steady state
	rss, hwm := procMem(b, cmd.Process.Pid)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	report(b, map[string]float64{
		"source-sync-ms":    ms(srcSync),
		"endpoints-call-ms": ms(endpointsCall),
		"source-heap-MB":    heap / (1 << 20),
		"turnout-sync-ms":   ms(binSync),
		"haproxy-start-ms":  ms(haStart),
		"change-p50-ms":     ms(percentile(lat, 0.5)),
		"change-max-ms":     ms(lat[len(lat)-1]),
		"turnout-rss-MB":    rss,
		"turnout-hwm-MB":    hwm,
	})
}

func metricLines(listen, prefix string) int {
	res, err := http.Get("http://" + listen + "/metrics")
	if err != nil {
		return -1
	}
	defer res.Body.Close()
	n := 0
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), prefix) {
			n++
		}
	}
	return n
}

// procMem returns VmRSS and VmHWM of pid in MiB.
func procMem(b *testing.B, pid int) (rss, hwm float64) {
	b.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "VmRSS:":
			rss = kb / 1024
		case "VmHWM:":
			hwm = kb / 1024
		}
	}
	return rss, hwm
}
