//go:build e2e

package e2e

import (
	"bytes"
	"cmp"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/turnout/turnout/lab/mock"
)

// TestSoak (issue 16 finding 10, issues 28 and 42) mixes, for
// $TURNOUT_SOAK (a duration; unset = skipped, `make soak` runs 10m),
// streaming and short requests through HAProxy (Lua and SPOE) and nginx
// (body mode) with issue 42's defences on (flow control with untrusted
// client headers and API-key tenants, adapters loaded on demand from a
// list) and traffic that tries them (soak_traffic_test.go), under proxy
// reloads, membership churn, replica restarts (killed with their streams,
// replaced), turnout reloads, turnout restarts (SIGTERM and SIGKILL in
// turn, every other one while replicas are down), turnout stopped and
// resumed, and a replica that stalls (soak_episodes_test.go). It asserts
// that the only failed requests are streams already open on a killed
// replica and requests a stalled replica held, each episode's own
// outcome, and that every decision the last turnout made was closed by the
// proxies' completion feedback (turnout_endpoint_inflight back to 0,
// decision_ttl far away). It prints a table per kind of request and
// turnout's RSS, goroutines and open fds for docs/reliability.md.
func TestSoak(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv("TURNOUT_SOAK"))
	if err != nil || d <= 0 {
		t.Skip("set TURNOUT_SOAK=10m (make soak) to run the soak test")
	}
	stream := func(c *mock.Config) {
		c.TimeScale = 1
		c.TTFTOverhead = 20 * time.Millisecond
		c.PerTokenPrefill = 0
		c.InterTokenLatency = 100 * time.Millisecond // 20 tokens: a 2 s stream
		c.EnableLoRA = true                          // od-1 is loaded on demand
		c.MaxLoRAs = 4
		c.RequestLogSize = 4096 // a stalled replica's arrivals
	}
	dep := func(prefix string) depSpec {
		return depSpec{name: "llama", policy: policyLeast, mocks: mocks(t, prefix, 4, stream), depYAML: soakDepYAML()}
	}
	t.Run("HAProxyLua", func(t *testing.T) {
		t.Parallel()
		s := startStack(t, "open", dep("sl"))
		soak(t, d, haproxyTarget(t, s, stream))
	})
	t.Run("HAProxySPOE", func(t *testing.T) {
		t.Parallel()
		s := startStackWith(t, "open", FreeAddr(t), dep("ss"))
		soak(t, d, haproxyTarget(t, s, stream))
	})
	t.Run("NginxBody", func(t *testing.T) {
		t.Parallel()
		s := startNginxStack(t, "open", ndep{name: "llama", policy: policyLeast, mode: "body", mocks: mocks(t, "sn", 4, stream), depYAML: soakDepYAML()})
		soak(t, d, soakTarget{
			url: s.N.URL, T: s.T, mocks: &s.deps[0].mocks,
			rewrite:     func() { s.T.Rewrite(t, soakYAML(t, s.yaml())) },
			reloadProxy: func() { _ = s.N.Cmd.Process.Signal(syscall.SIGHUP) },
			newMock:     func(name string) *Mock { return StartMock(t, name, stream) },
			restartMock: func(old *Mock) *Mock { return StartMockAt(t, old.Name, old.Addr, stream) },
		})
	})
}

// soakYAML is a stack's config for the soak: decision_ttl far away, so a
// lost decision stays visible, and health checks that time out after 1 s
// instead of the stacks' 300 ms: three stacks, 12 replicas and the
// restarts on a shared 2-core box once starved every check of one backend
// at once (82 HAProxy 503s "no server available"), which is not what the
// soak is after.
func soakYAML(t *testing.T, y string) string {
	const fast, slow = "health: {interval: 300ms, timeout: 300ms", "health: {interval: 300ms, timeout: 1s"
	if !strings.Contains(y, fast) {
		t.Fatalf("soak: the stack's config has no %q to relax", fast)
	}
	return strings.Replace(y, fast, slow, 1) + "decision_ttl: 1h\n"
}

type soakTarget struct {
	url         string
	T           *Turnout
	mocks       *[]*Mock
	rewrite     func()
	reloadProxy func()
	newMock     func(name string) *Mock
	// restartMock starts a replica again on old's name and address.
	restartMock func(old *Mock) *Mock
}

// restartTurnout stops turnout (SIGKILL when kill, else SIGTERM: it closes
// its listeners and finishes what it started) and starts it again with the
// same command line, as a crash or a rolling update would; the proxies fail
// open meanwhile. whileDown, if set, runs while no turnout runs. st.T
// keeps pointing at the running turnout.
func (st soakTarget) restartTurnout(t *testing.T, kill bool, whileDown func()) {
	old := st.T.Proc
	if kill {
		_ = old.Cmd.Process.Kill()
	}
	old.Stop()
	if whileDown != nil {
		whileDown()
	}
	st.T.Proc = StartProc(t, "turnout", old.Cmd.Path, old.Cmd.Args[1:]...)
	WaitHTTP(t, st.T.URL+"/healthz", 10*time.Second)
}

// procFigures are turnout's RSS, goroutines and open fds (its /metrics).
type procFigures struct {
	rssMB, goroutines, fds float64
	at                     time.Time
}

func readProcFigures(t *testing.T, url string) procFigures {
	f := procFigures{at: time.Now()}
	for _, m := range []struct {
		name string
		v    *float64
	}{{"process_resident_memory_bytes", &f.rssMB}, {"go_goroutines", &f.goroutines}, {"process_open_fds", &f.fds}} {
		v, err := Metric(t, url+"/metrics", m.name)
		if err != nil {
			t.Logf("%s: %v", m.name, err)
		}
		*m.v = v
	}
	f.rssMB /= 1e6
	return f
}

func (f procFigures) String() string {
	return fmt.Sprintf("%.1f MB RSS, %.0f goroutines, %.0f fds", f.rssMB, f.goroutines, f.fds)
}

// lifetime is one turnout process's figures after warm-up and before it
// was stopped (or at the end of the soak).
type lifetime struct{ first, last procFigures }

func (l lifetime) String() string {
	return fmt.Sprintf("%v -> %v over %v", l.first, l.last, l.last.at.Sub(l.first.at).Round(time.Second))
}

func haproxyTarget(t *testing.T, s *hstack, edit func(*mock.Config)) soakTarget {
	return soakTarget{
		url: s.H.URL, T: s.T, mocks: &s.deps[0].mocks,
		rewrite:     func() { s.T.Rewrite(t, soakYAML(t, s.yaml())) },
		reloadProxy: func() { _ = s.H.Cmd.Process.Signal(syscall.SIGUSR2) },
		newMock:     func(name string) *Mock { return StartMock(t, name, edit) },
		restartMock: func(old *Mock) *Mock { return StartMockAt(t, old.Name, old.Addr, edit) },
	}
}

func getMetrics(t *testing.T, url string) string {
	res, err := http.Get(url + "/metrics")
	if err != nil {
		return err.Error()
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return string(b)
}

// The failures the soak allows: a stream already open on a replica that
// was killed (its bytes are gone with it), and a request a stalled
// replica held (its client gives up, or the replica is closed).
const (
	soakKilledCut = "stream open on a killed replica, cut"
	soakHeld      = "held by a stalled replica"
)

// soaker is one stack's soak: the load, the events, what they left.
type soaker struct {
	t  *testing.T
	st soakTarget

	mu      sync.Mutex
	results []soakResult
	killed  map[string]bool // replicas killed with their streams
	held    map[string]bool // request ids a stalled replica held
	stalls  []*stallEpisode
	stops   []stopEpisode

	// The event loop's own (one goroutine).
	begin      time.Time
	events     []string
	timeline   []string // each event with its time from the start
	counter    int
	recovering *stallEpisode // a replica whose stall was lifted, until readmitted
	tally      soakTally     // what each turnout counted, summed
}

func (s *soaker) event(e string) {
	s.events = append(s.events, e)
	s.timeline = append(s.timeline, fmt.Sprintf("%+.1fs %s", time.Since(s.begin).Seconds(), e))
}

// pick is a random replica's index, never the one being readmitted.
func (s *soaker) pick() int {
	ms := *s.st.mocks
	for {
		i := rand.IntN(len(ms))
		if s.recovering == nil || ms[i] != s.recovering.m {
			return i
		}
	}
}

func soak(t *testing.T, d time.Duration, st soakTarget) {
	st.rewrite() // decision_ttl: 1h
	time.Sleep(2 * time.Second)
	s := &soaker{t: t, st: st, killed: map[string]bool{}, held: map[string]bool{}, begin: time.Now()}
	rcvErrs0 := udpRcvbufErrors()
	// Figures of the first turnout at the start, and of the longest-lived
	// one from its start to its stop: restarts make a start-vs-end
	// comparison of one process span part of the run only.
	first := lifetime{first: readProcFigures(t, st.T.URL)}
	cur, longest := first, lifetime{}
	begin := s.begin
	lastRestart := begin
	restarts := 0
	stop := make(chan struct{})
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 30 * time.Second}
	for w := range soakWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				q := soakNext(w, i)
				r := soakDo(client, st.url, q)
				s.mu.Lock()
				if r.cause == "stream cut" && s.killed[r.replica] {
					r.cause = soakKilledCut
				}
				s.results = append(s.results, r)
				s.mu.Unlock()
				if r.note != "" && r.retries == 0 {
					time.Sleep(100 * time.Millisecond) // refusals come fast: keep them a part of the load
				}
			}
		}()
	}

	// The episodes of issue 42 come at their own pace, the rest at random.
	stallEvery, stopEvery := max(time.Minute, d/5), max(40*time.Second, d/8)
	nextStall, nextStop := begin.Add(15*time.Second), begin.Add(35*time.Second)
	end := begin.Add(d)
	for time.Now().Before(end) {
		time.Sleep(time.Duration(2000+rand.IntN(2000)) * time.Millisecond)
		s.checkRecovery(false)
		ms := *st.mocks
		ev := rand.IntN(6)
		switch now := time.Now(); {
		case now.After(nextStall) && s.recovering == nil:
			nextStall = now.Add(stallEvery)
			s.stall()
			continue
		case now.After(nextStop):
			nextStop = now.Add(stopEvery)
			s.sigstop()
			continue
		}
		switch ev {
		case 0:
			st.reloadProxy()
			s.event("proxy reload")
		case 1: // churn: replace a replica gracefully (it leaves the config first)
			s.counter++
			i := s.pick()
			old := ms[i]
			nm := st.newMock(fmt.Sprintf("churn-%d", s.counter))
			next := append(append([]*Mock(nil), ms[:i]...), ms[i+1:]...)
			*st.mocks = append(next, nm)
			st.rewrite()
			go func() { time.Sleep(5 * time.Second); _ = old.Close() }()
			s.event("churn")
		case 2: // replica restart: it dies with its streams, and comes back
			s.counter++
			i := s.pick()
			s.mu.Lock()
			s.killed[ms[i].Name] = true
			s.mu.Unlock()
			_ = ms[i].Close()
			if s.counter%2 == 0 {
				// In place, a second later (a container restarted in its
				// pod): the config does not change, health checks see it.
				time.Sleep(time.Second)
				(*st.mocks)[i] = st.restartMock(ms[i])
				s.event("replica restart (same address)")
				break
			}
			// Replaced (a pod restarted elsewhere): it leaves the config.
			nm := st.newMock(fmt.Sprintf("kill-%d", s.counter))
			next := append(append([]*Mock(nil), ms[:i]...), ms[i+1:]...)
			*st.mocks = append(next, nm)
			st.rewrite()
			s.event("replica restart (replaced)")
		case 3:
			_ = st.T.Cmd.Process.Signal(syscall.SIGHUP)
			s.event("turnout reload")
		case 4:
			// At most one a minute, so each turnout lives long enough
			// for its own figures to mean something.
			if time.Since(lastRestart) < time.Minute {
				s.event("quiet")
				break
			}
			restarts++
			cur.last = readProcFigures(t, st.T.URL)
			if cur.last.at.Sub(cur.first.at) > longest.last.at.Sub(longest.first.at) {
				longest = cur
			}
			if first.last.at.IsZero() {
				first.last = cur.last
			}
			s.tally.add(t, st.T.URL)
			if s.recovering != nil {
				s.recovering.end = "readmission not seen: turnout restarted (a new turnout starts it undegraded)"
				s.recovering = nil
			}
			// Every other restart while a replica is down (killed with its
			// streams), back in place a second after turnout: turnout
			// starts before it, its model list unknown.
			var down []int
			var whileDown func()
			if restarts%2 == 1 {
				whileDown = func() {
					down = []int{s.pick()}
					for _, i := range down {
						s.mu.Lock()
						s.killed[ms[i].Name] = true
						s.mu.Unlock()
						_ = ms[i].Close()
					}
				}
			}
			st.restartTurnout(t, restarts%4 < 2, whileDown)
			lastRestart = time.Now()
			time.Sleep(time.Second)
			for _, i := range down {
				(*st.mocks)[i] = st.restartMock(ms[i])
			}
			cur = lifetime{first: readProcFigures(t, st.T.URL)}
			if whileDown != nil {
				s.event("turnout restart before replicas")
			} else {
				s.event("turnout restart")
			}
		case 5:
			s.event("quiet")
		}
	}
	close(stop)
	wg.Wait()
	s.checkRecovery(true)
	s.report(d)

	closed := func() bool {
		v, err := Metric(t, st.T.URL+"/metrics", "turnout_endpoint_inflight")
		return err == nil && v == 0
	}
	for deadline := time.Now().Add(30 * time.Second); !closed(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			var lines []string
			for _, l := range strings.Split(getMetrics(t, st.T.URL), "\n") {
				if (strings.HasPrefix(l, "turnout_endpoint_inflight") && !strings.HasSuffix(l, " 0")) ||
					strings.HasPrefix(l, "turnout_completions_total") || strings.HasPrefix(l, "turnout_feedback_") {
					lines = append(lines, l)
				}
			}
			t.Errorf("decisions still open 30s after the load stopped (turnout restarted %v ago; kernel UDP receive drops during the run: %d):\n%s",
				time.Since(lastRestart).Round(time.Second), udpRcvbufErrors()-rcvErrs0, strings.Join(lines, "\n"))
			break
		}
	}
	s.tally.add(t, st.T.URL)
	s.checkTally()
	cur.last = readProcFigures(t, st.T.URL)
	if cur.last.at.Sub(cur.first.at) > longest.last.at.Sub(longest.first.at) {
		longest = cur
	}
	t.Logf("turnout figures: first turnout at the start %v; last turnout at the end %v; longest-lived turnout %v", first.first, cur.last, longest)
	// Flat: the longest-lived turnout ends near where it started (RSS
	// settles at ~45 MB after its first minutes; goroutines and fds move
	// with the proxies' connections open at the sample).
	if f, l := longest.first, longest.last; l.rssMB > 2*f.rssMB+16 || l.goroutines > f.goroutines+150 || l.fds > f.fds+150 {
		t.Errorf("the longest-lived turnout grew: %v", longest)
	}
	if n := udpRcvbufErrors() - rcvErrs0; n > 0 {
		t.Logf("note: the kernel dropped %d UDP datagrams (RcvbufErrors, all sockets) during the run", n)
	}
}

// report prints the table of requests by kind and outcome and the
// episodes, and fails the soak on any failure it does not allow.
func (s *soaker) report(d time.Duration) {
	t := s.t
	s.mu.Lock()
	defer s.mu.Unlock()
	type row struct {
		sent, ok, retried int
		notes, causes     map[string]int
	}
	var rows [nKinds]row
	samples := map[string]string{}
	total, failed := 0, 0
	for i := range s.results {
		r := &s.results[i]
		if !r.ok && s.held[r.id] {
			r.cause = soakHeld
		}
		w := &rows[r.kind]
		if w.notes == nil {
			w.notes, w.causes = map[string]int{}, map[string]int{}
		}
		total++
		w.sent++
		if r.retries > 0 {
			w.retried++
		}
		if r.ok {
			w.ok++
			if r.note != "" {
				w.notes[r.note]++
			}
			continue
		}
		failed++
		w.causes[r.cause]++
		at := r.start.Sub(s.begin).Seconds()
		if _, ok := samples[r.cause]; !ok {
			samples[r.cause] = fmt.Sprintf("%s %s at %s, sent %+.1fs: %s", kindNames[r.kind], r.id, r.replica, at, r.detail)
		}
		if r.cause != soakKilledCut && r.cause != soakHeld {
			samples[r.cause] += fmt.Sprintf("; last sent %+.1fs", at)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "soak %v: %d/%d requests failed; events: %d (%s)\n", d, failed, total, len(s.events), countEvents(s.events))
	fmt.Fprintf(&b, "| kind | sent | answered as expected | of which | 503 Retry-After retried | failed by cause |\n|---|---|---|---|---|---|\n")
	for k, w := range rows {
		fmt.Fprintf(&b, "| %s | %d | %d | %s | %d | %s |\n", kindNames[k], w.sent, w.ok, countsOf(w.notes), w.retried, countsOf(w.causes))
	}
	for _, e := range s.stalls {
		fmt.Fprintf(&b, "%v\n", e)
	}
	for _, l := range s.checkStops() {
		fmt.Fprintf(&b, "%s\n", l)
	}
	t.Log(b.String())
	bad := false
	for k, w := range rows {
		if w.sent == 0 {
			t.Errorf("no %s request was sent", kindNames[k])
		}
		for cause, n := range w.causes {
			if cause != soakKilledCut && cause != soakHeld {
				bad = true
				t.Errorf("%d %s requests failed for another reason than a killed or stalled replica: %s (e.g. %s)", n, kindNames[k], cause, samples[cause])
			}
		}
	}
	if bad {
		t.Logf("events: %s", strings.Join(s.timeline, "; "))
	}
}

// checkTally: what the turnouts counted shows flow control held requests,
// took no priority and no tenant from a client's header, and loaded only
// the listed adapter; no replica lists a name a client made up.
func (s *soaker) checkTally() {
	t, a := s.t, &s.tally
	t.Logf("turnouts counted: flow held %.0f (released or timed out), tenants team-a %.0f, team-b %.0f, none %.0f, critical %.0f, client-invented %.0f; loads od-1 %.0f, other names %.0f, limited %.0f; decisions closed as abandoned %.0f",
		a.held, a.teamA, a.teamB, a.none, a.critical, a.evilTenants, a.loadsListed, a.loadsUnlisted, a.loadsLimited, a.abandoned)
	if a.held == 0 {
		t.Error("flow control never held a request: the soak did not exercise it")
	}
	if a.teamA == 0 || a.teamB == 0 || a.none == 0 {
		t.Errorf("tenants not seen as configured: team-a %.0f, team-b %.0f, none %.0f", a.teamA, a.teamB, a.none)
	}
	if a.critical != 0 || a.evilTenants != 0 {
		t.Errorf("client headers bought something: %.0f requests classed critical, %.0f under a client-invented tenant", a.critical, a.evilTenants)
	}
	if a.loadsListed == 0 {
		t.Error("od-1 was never loaded on demand")
	}
	if a.loadsUnlisted != 0 {
		t.Errorf("%.0f loads of names not listed: %v", a.loadsUnlisted, a.unlisted)
	}
	for _, m := range *s.st.mocks {
		res, err := http.Get("http://" + m.Addr + "/v1/models")
		if err != nil {
			t.Errorf("%s /v1/models: %v", m.Name, err)
			continue
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if bytes.Contains(body, []byte("evil")) {
			t.Errorf("%s serves a name a client chose: %.300s", m.Name, body)
		}
	}
}

// countsOf renders a count map as "n what, ..." (largest first).
func countsOf(m map[string]int) string {
	keys := slices.Collect(maps.Keys(m))
	slices.SortFunc(keys, func(a, b string) int { return cmp.Or(m[b]-m[a], strings.Compare(a, b)) })
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d %s", m[k], k))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

func countEvents(ev []string) string {
	m := map[string]int{}
	for _, e := range ev {
		m[e]++
	}
	var parts []string
	for _, k := range []string{"proxy reload", "churn", "replica restart (replaced)", "replica restart (same address)", "turnout reload", "turnout restart",
		"turnout restart before replicas", "turnout SIGSTOP", "replica stall, then recovery", "replica stall, then replaced", "stall skipped (limit not scaled)", "quiet"} {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// udpRcvbufErrors reads the kernel's UDP RcvbufErrors counter (datagrams
// dropped because a socket's receive buffer was full).
func udpRcvbufErrors() int64 {
	b, err := os.ReadFile("/proc/net/snmp")
	if err != nil {
		return 0
	}
	var head []string
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Udp:" {
			continue
		}
		if head == nil {
			head = f
			continue
		}
		for i, h := range head {
			if h == "RcvbufErrors" && i < len(f) {
				var n int64
				fmt.Sscan(f[i], &n)
				return n
			}
		}
	}
	return 0
}
