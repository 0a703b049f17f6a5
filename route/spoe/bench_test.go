package spoe

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/turnout/turnout/lab/testenv/freeport"
)

// TestWrkCompare measures HAProxy throughput with wrk, alternating setups in
// one run (the box is shared, so ratios within a run are what count):
//
//	plain           HAProxy balance roundrobin to the replicas, no turnout
//	spoe            HAProxy + SPOE + turnout, with the feedback log line
//	spoe-unix       spoe with the agent on a unix socket
//	spoe-nolog      spoe without the log line
//	plain+retry-on  plain with haproxy.cfg.tmpl's L7 retry-on
//	spoe+retry-on   spoe with it: the SPOE setup as it would be rendered
//	lua             `turnout render haproxy` output (Lua action + route hop +
//	                turnout HTTP; it has retry-on)
//	lua-noretry     the same render with the retry-on line removed
//
// Opt-in: TURNOUT_SPOE_BENCH=1 go test -run TestWrkCompare -v ./route/spoe/
// Knobs: TURNOUT_SPOE_BENCH_ROUNDS (3), TURNOUT_SPOE_BENCH_DURATION (5s),
// TURNOUT_SPOE_BENCH_CONNS (32), TURNOUT_SPOE_BENCH_POLICY (prefix-affinity),
// TURNOUT_BIN (a turnout binary for the Lua render; default: go build),
// TURNOUT_SPOE_BENCH_ONLY (comma-separated setups besides plain).
func TestWrkCompare(t *testing.T) {
	if os.Getenv("TURNOUT_SPOE_BENCH") == "" {
		t.Skip("set TURNOUT_SPOE_BENCH=1 to run the wrk comparison")
	}
	needHAProxy(t)
	wrk, err := exec.LookPath("wrk")
	if err != nil {
		t.Skip("wrk not installed")
	}
	rounds := envInt("TURNOUT_SPOE_BENCH_ROUNDS", 3)
	dur := envStr("TURNOUT_SPOE_BENCH_DURATION", "5s")
	conns := envStr("TURNOUT_SPOE_BENCH_CONNS", "32")
	policy := envStr("TURNOUT_SPOE_BENCH_POLICY", "prefix-affinity")
	dir := t.TempDir()

	reps := []*replica{startReplica(t, "r0"), startReplica(t, "r1"), startReplica(t, "r2")}
	syslog := freeport.Addr(t)
	luaListen, spoeListen, nologListen, plainListen := freeport.Addr(t), freeport.Addr(t), freeport.Addr(t), freeport.Addr(t)
	plainRetryListen, spoeRetryListen := freeport.Addr(t), freeport.Addr(t)
	routeAddr := freeport.Addr(t)
	yaml := fmt.Sprintf(`
listen: %s
session_headers: [x-session-id]
max_body: 262144
feedback: {syslog: %s}
health: {disable: true}
haproxy: {listen: %s}
deployments:
  - name: llama
    models: [llama]
    policy: {name: %s}
    pools:
      - role: mixed
        endpoints:
          - {name: r0, address: %s}
          - {name: r1, address: %s}
          - {name: r2, address: %s}
`, routeAddr, syslog, luaListen, policy, reps[0].addr, reps[1].addr, reps[2].addr)
	agentAddr := freeport.Addr(t)
	tp := startTurnout(t, yaml, agentAddr, true)
	tp.serveHTTP(t, routeAddr)
	agentSock := filepath.Join(dir, "agent.sock")
	tp.serveUnix(t, agentSock)

	backends := []cfgBackend{{Name: "llama_mixed", Servers: []cfgServer{
		{Name: "r0", Addr: reps[0].addr}, {Name: "r1", Addr: reps[1].addr}, {Name: "r2", Addr: reps[2].addr}}}}
	mk := func(name, listen, agent string, syslog string, retryOn bool) benchSetup {
		d := &cfgData{Generator: "route/spoe bench", Dir: filepath.Join(dir, name), Listen: listen, Syslog: syslog,
			DefaultBackend: "llama_mixed", BufSize: 262144 + 16384, RouteBody: 262144, Backends: backends, RetryOn: retryOn}
		if err := os.MkdirAll(d.Dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if agent != "" {
			d.SPOE = newSPOEData(d.Dir, agent, 2, false)
			d.ServerVars = serverVars(2)
		}
		renderTestConfig(t, d)
		return benchSetup{name, listen, startHAProxy(t, filepath.Join(d.Dir, "haproxy.cfg"), listen)}
	}
	setups := []benchSetup{
		mk("plain", plainListen, "", "", false),
		mk("spoe", spoeListen, agentAddr, syslog, false),
		mk("spoe-unix", freeport.Addr(t), "unix@"+agentSock, syslog, false),
		mk("spoe-nolog", nologListen, agentAddr, "", false),
		mk("plain+retry-on", plainRetryListen, "", "", true),
		mk("spoe+retry-on", spoeRetryListen, agentAddr, syslog, true),
	}
	if ha := startLuaHAProxy(t, filepath.Join(dir, "lua"), yaml, luaListen, false); ha != nil {
		setups = append(setups, benchSetup{"lua", luaListen, ha})
	}
	// The same render without retry-on, to compare the hops alone.
	luaNoRetry := freeport.Addr(t)
	yaml2 := strings.Replace(yaml, "haproxy: {listen: "+luaListen+"}", "haproxy: {listen: "+luaNoRetry+"}", 1)
	if ha := startLuaHAProxy(t, filepath.Join(dir, "lua-noretry"), yaml2, luaNoRetry, true); ha != nil {
		setups = append(setups, benchSetup{"lua-noretry", luaNoRetry, ha})
	}

	if only := os.Getenv("TURNOUT_SPOE_BENCH_ONLY"); only != "" {
		keep := setups[:0]
		for _, s := range setups {
			if s.name == "plain" || strings.Contains(","+only+",", ","+s.name+",") {
				keep = append(keep, s)
			}
		}
		setups = keep
	}

	script := filepath.Join(dir, "post.lua")
	body := chatBody("llama", strings.Repeat("Tell me more about routing. ", 36))
	write(t, script, []byte(fmt.Sprintf(`wrk.method = "POST"
wrk.body = %q
wrk.headers["Content-Type"] = "application/json"
`, body)))
	t.Logf("body %d bytes, policy %s, wrk -t1 -c%s -d%s, %d rounds", len(body), policy, conns, dur, rounds)

	// Each setup must route before it is measured.
	for _, s := range setups {
		if a := post(t, s.addr, "/v1/chat/completions", body); a.status != 200 || a.replica == "" {
			t.Fatalf("%s: status %d replica %q", s.name, a.status, a.replica)
		}
	}
	res := map[string][]wrkResult{}
	for r := range rounds {
		order := setups
		if r%2 == 1 { // alternate the order: drifting background load hits all setups alike
			order = append(order[:0:0], setups...)
			for i, j := 0, len(order)-1; i < j; i, j = i+1, j-1 {
				order[i], order[j] = order[j], order[i]
			}
		}
		for _, s := range order {
			ha0, self0 := cpuTicks(s.ha.cmd.Process.Pid), ownTicks(os.Getpid())
			w := runWrk(t, wrk, conns, dur, script, "http://"+s.addr+"/v1/chat/completions")
			// CPU per request: HAProxy's, and this process's (replicas,
			// plus turnout and its agent when the setup uses them).
			n := w.rps * w.secs
			w.haUS = float64(cpuTicks(s.ha.cmd.Process.Pid)-ha0) * 1e4 / n
			w.goUS = float64(ownTicks(os.Getpid())-self0) * 1e4 / n
			res[s.name] = append(res[s.name], w)
			t.Logf("round %d %-14s %6.0f rps p50 %-8s p99 %-8s cpu/req haproxy %4.1fus go %4.1fus load %s",
				r+1, s.name, w.rps, w.p50, w.p99, w.haUS, w.goUS, w.load)
		}
	}
	var b strings.Builder
	base := median(res["plain"])
	fmt.Fprintf(&b, "| setup | rps per round | median rps | ratio to plain, median (per-round range) | p50 / p99 (median round) | CPU us/req haproxy / go (median round) |\n|---|---|---|---|---|---|\n")
	for _, s := range setups {
		var rps []string
		lo, hi := 1e9, 0.0
		for i, w := range res[s.name] {
			rps = append(rps, fmt.Sprintf("%.0f", w.rps))
			q := w.rps / res["plain"][i].rps
			lo, hi = min(lo, q), max(hi, q)
		}
		ws := res[s.name]
		m := medianRound(ws)
		fmt.Fprintf(&b, "| %s | %s | %.0f | %.2f (%.2f-%.2f) | %s / %s | %.1f / %.1f |\n", s.name, strings.Join(rps, " / "), median(ws), median(ws)/base, lo, hi,
			m.p50, m.p99, m.haUS, m.goUS)
	}
	t.Logf("\n%s", b.String())
	if out := os.Getenv("TURNOUT_SPOE_BENCH_OUT"); out != "" {
		write(t, out, []byte(b.String()))
	}
}

type benchSetup struct {
	name, addr string
	ha         *haproxyProc
}

type wrkResult struct {
	rps, secs  float64
	p50, p99   string
	non2xx     int
	load       string
	haUS, goUS float64 // CPU microseconds per request
}

var (
	rpsRe    = regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`)
	p50Re    = regexp.MustCompile(`\n\s+50%\s+(\S+)`)
	p99Re    = regexp.MustCompile(`\n\s+99%\s+(\S+)`)
	non2xxRe = regexp.MustCompile(`Non-2xx or 3xx responses:\s+(\d+)`)
)

func runWrk(t *testing.T, wrk, conns, dur, script, url string) wrkResult {
	t.Helper()
	load, _ := os.ReadFile("/proc/loadavg")
	out, err := exec.Command(wrk, "-t1", "-c"+conns, "-d"+dur, "--latency", "-s", script, url).CombinedOutput()
	if err != nil {
		t.Fatalf("wrk: %v\n%s", err, out)
	}
	var w wrkResult
	if m := rpsRe.FindSubmatch(out); m != nil {
		w.rps, _ = strconv.ParseFloat(string(m[1]), 64)
	}
	if m := p50Re.FindSubmatch(out); m != nil {
		w.p50 = string(m[1])
	}
	if m := p99Re.FindSubmatch(out); m != nil {
		w.p99 = string(m[1])
	}
	if m := non2xxRe.FindSubmatch(out); m != nil {
		w.non2xx, _ = strconv.Atoi(string(m[1]))
	}
	if f := strings.Fields(string(load)); len(f) >= 3 {
		w.load = strings.Join(f[:3], " ")
	}
	d, _ := time.ParseDuration(dur)
	w.secs = d.Seconds()
	if w.rps == 0 || w.non2xx > 0 {
		t.Errorf("wrk %s: %s", url, out)
	}
	return w
}

// medianRound is the round with the median rps.
func medianRound(ws []wrkResult) wrkResult {
	s := append([]wrkResult(nil), ws...)
	sort.Slice(s, func(i, j int) bool { return s[i].rps < s[j].rps })
	return s[len(s)/2]
}

// cpuTicks is the user+system CPU time, in clock ticks (1/100 s), of a
// process and its children (HAProxy's master-worker mode runs a worker).
func cpuTicks(pid int) int64 {
	n := ownTicks(pid)
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		child, err := strconv.Atoi(d.Name())
		if err != nil || child == pid {
			continue
		}
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", child)); err == nil {
			f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
			if len(f) > 1 && f[1] == strconv.Itoa(pid) {
				n += ownTicks(child)
			}
		}
	}
	return n
}

func ownTicks(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command name (which may hold spaces): state is 3rd,
	// utime 14th, stime 15th.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return u + s
}

func median(ws []wrkResult) float64 {
	v := make([]float64, len(ws))
	for i, w := range ws {
		v[i] = w.rps
	}
	sort.Float64s(v)
	return v[len(v)/2]
}

// startLuaHAProxy renders the Lua setup with `turnout render haproxy` and
// starts it (without its retry-on line when noRetry); nil when the render
// fails (logged, the other setups still run).
func startLuaHAProxy(t *testing.T, dir, yaml, listen string, noRetry bool) *haproxyProc {
	t.Helper()
	bin := os.Getenv("TURNOUT_BIN")
	if bin == "" {
		bin = filepath.Join(t.TempDir(), "turnout")
		if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/turnout").CombinedOutput(); err != nil {
			t.Logf("lua setup skipped: go build: %v\n%s", err, out)
			return nil
		}
	}
	cfg := filepath.Join(t.TempDir(), "turnout.yaml")
	write(t, cfg, []byte(yaml))
	var out bytes.Buffer
	cmd := exec.Command(bin, "render", "haproxy", "--config", cfg, "--out", dir)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Logf("lua setup skipped: render: %v\n%s", err, out.String())
		return nil
	}
	if noRetry {
		path := filepath.Join(dir, "haproxy.cfg")
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		b = regexp.MustCompile(`(?m)^\s*retry-on .*$`).ReplaceAll(b, nil)
		write(t, path, b)
	}
	ha := startHAProxy(t, filepath.Join(dir, "haproxy.cfg"), listen)
	// The route hop's health check must see turnout before the Lua can route.
	time.Sleep(1500 * time.Millisecond)
	return ha
}

func envInt(k string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(k)); err == nil && v > 0 {
		return v
	}
	return def
}

func envStr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
