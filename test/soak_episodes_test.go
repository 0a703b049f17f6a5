//go:build e2e

package e2e

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/turnout/turnout/lab/mock"
)

// The soak's episodes beyond proxy reloads, churn and kills (issue 42):
// a replica that stalls, turnout stopped (SIGSTOP) and resumed, turnout
// restarted while replicas are down. Each runs alone in the soak's event
// loop (the load goes on), so its own expected outcome can be told apart.

// soakStallBound is the bound on the stalled replica's last new
// request. Past ~2.9 s of limit (3x the p99 first-token time; ~6 s here,
// where a short answer's first byte is its last, 2 s) detection takes
// ~1.75x the limit (docs/reliability.md): the bound is then
// soakStallLimits x the limit.
const (
	soakStallBound  = 5 * time.Second
	soakStallLimits = 2
)

// soakStallRecover bounds a recovered replica's way back: the next probe
// comes health.stall.readmit (the 30 s budget by default) after the one
// that degraded it.
const soakStallRecover = 45 * time.Second

// stallEpisode is one replica stalled: it accepts completions and never
// answers until the episode ends (it recovers, or is replaced).
type stallEpisode struct {
	replica  string
	m        *Mock
	start    time.Time
	limit    float64       // its stall limit (seconds) before the stall
	degraded time.Duration // from the stall to degraded; -1: never
	lastNew  time.Duration // from the stall to the last completion it received
	held     int           // completions it received from a second before the stall on
	ended    time.Time     // the stall lifted (recovery) or the replica closed
	end      string
}

func (e *stallEpisode) String() string {
	deg := "never degraded"
	if e.degraded >= 0 {
		deg = "degraded after " + e.degraded.Round(10*time.Millisecond).String()
	}
	return fmt.Sprintf("%s stalled (limit %.2fs): %s, last new request %+.2fs, %d held; %s",
		e.replica, e.limit, deg, e.lastNew.Seconds(), e.held, e.end)
}

// waitFor polls cond every 100 ms for at most d.
func waitFor(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); ; time.Sleep(100 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// stall stalls one replica, checks that it takes no new request past its
// bound and records the requests it holds (their failures are their own
// cause), then lifts the stall (the replica must be readmitted) or
// replaces the replica, in turn.
func (s *soaker) stall() {
	t := s.t
	i := s.pick()
	m := (*s.st.mocks)[i]
	ep := `endpoint="` + m.Name + `"`
	metric := func(name string) float64 { return metricOr0(t, s.st.T.URL+"/metrics", name, ep) }
	// A turnout restarted a moment ago applies the 30 s budget until it
	// knows first-token times: the episode waits for a scaled limit (~6 s
	// here: a short answer's first byte is its last, 2 s).
	scaled := func() bool { l := metric("turnout_endpoint_stall_limit_seconds"); return l > 0 && l < 30 }
	if !waitFor(20*time.Second, scaled) {
		s.event("stall skipped (limit not scaled)")
		return
	}
	e := &stallEpisode{replica: m.Name, m: m, limit: metric("turnout_endpoint_stall_limit_seconds"), degraded: -1}
	if err := m.SetFaults(mock.Faults{Stall: 10 * time.Minute}); err != nil {
		t.Errorf("stall %s: %v", m.Name, err)
		return
	}
	e.start = time.Now()
	s.mu.Lock()
	s.stalls = append(s.stalls, e)
	s.mu.Unlock()
	// Detection takes ~1.75x the limit (docs/reliability.md); the limit
	// is at most the 30 s budget.
	if waitFor(60*time.Second, func() bool { return metric("turnout_endpoint_degraded") == 1 }) {
		e.degraded = time.Since(e.start)
	} else {
		t.Errorf("%s stalled: not degraded within 60s", m.Name)
	}
	time.Sleep(3 * time.Second) // load goes on: nothing new may reach it
	// The mock reads its faults after a request's body: one it received
	// up to a moment before the stall began may be held too.
	heldFrom := e.start.Add(-time.Second)
	e.lastNew = -time.Second
	s.mu.Lock()
	for id, at := range chatArrivals(t, m) {
		if at.Before(heldFrom) {
			continue
		}
		s.held[id] = true
		e.held++
		e.lastNew = max(e.lastNew, at.Sub(e.start))
	}
	s.mu.Unlock()
	if b := max(soakStallBound, soakStallLimits*time.Duration(e.limit*float64(time.Second))); e.lastNew > b {
		t.Errorf("%s stalled: received a new request %.2fs after the stall began, want <= %v", m.Name, e.lastNew.Seconds(), b)
	}
	if e.held == 0 {
		t.Errorf("%s stalled: held no request (not the scenario)", m.Name)
	}
	if len(s.stalls)%2 == 1 {
		// It answers again; requests it holds stay held (their clients give up).
		if err := m.SetFaults(mock.Faults{}); err != nil {
			t.Errorf("lift the stall of %s: %v", m.Name, err)
		}
		e.ended, e.end = time.Now(), "recovering"
		s.recovering = e
		s.event("replica stall, then recovery")
		return
	}
	// Replaced: it leaves the config and closes (what it held is cut).
	s.counter++
	nm := s.st.newMock(fmt.Sprintf("unstall-%d", s.counter))
	ms := *s.st.mocks
	*s.st.mocks = append(append(append([]*Mock(nil), ms[:i]...), ms[i+1:]...), nm)
	s.st.rewrite()
	_ = m.Close()
	e.ended, e.end = time.Now(), "replaced"
	s.event("replica stall, then replaced")
}

// checkRecovery follows a replica whose stall was lifted: turnout readmits
// it (its degraded mark goes) within soakStallRecover.
func (s *soaker) checkRecovery(final bool) {
	e := s.recovering
	if e == nil {
		return
	}
	if metricOr0(s.t, s.st.T.URL+"/metrics", "turnout_endpoint_degraded", `endpoint="`+e.replica+`"`) == 0 {
		e.end = fmt.Sprintf("readmitted %.1fs after the stall was lifted", time.Since(e.ended).Seconds())
		s.recovering = nil
		return
	}
	switch {
	case time.Since(e.ended) > soakStallRecover:
		s.t.Errorf("%s: still degraded %v after its stall was lifted", e.replica, time.Since(e.ended).Round(time.Second))
		e.end = "not readmitted"
		s.recovering = nil
	case final:
		e.end = fmt.Sprintf("still degraded %.1fs after the stall was lifted, when the soak ended", time.Since(e.ended).Seconds())
	}
}

// stopEpisode is turnout stopped (SIGSTOP: the kernel accepts its
// connections, nothing answers) and resumed.
type stopEpisode struct{ stop, cont time.Time }

// soakStopSlack is how long after SIGCONT the requests that met the stop
// may still wait for their headers: turnout answers the calls queued
// meanwhile, flow control may hold some (as any time the pool is full).
const soakStopSlack = 5 * time.Second

// sigstop stops turnout for 2-5 s, shorter than the stall budget (30 s)
// and the proxies' route call timeout (flow control's longest max_wait +
// route_timeout + 1 s).
func (s *soaker) sigstop() {
	d := time.Duration(2000+rand.IntN(3000)) * time.Millisecond
	p := s.st.T.Cmd.Process
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		s.t.Errorf("SIGSTOP: %v", err)
		return
	}
	e := stopEpisode{stop: time.Now()}
	time.Sleep(d)
	if err := p.Signal(syscall.SIGCONT); err != nil {
		s.t.Errorf("SIGCONT: %v", err)
	}
	e.cont = time.Now()
	s.mu.Lock()
	s.stops = append(s.stops, e)
	s.mu.Unlock()
	s.event("turnout SIGSTOP")
}

// checkStops: every request that started while turnout was stopped (or a
// second before) had its headers within soakStopSlack of the resume, and
// none failed (the soak's rule).
func (s *soaker) checkStops() []string {
	var lines []string
	for _, e := range s.stops {
		n, worst := 0, time.Duration(0)
		var late []string
		for _, r := range s.results {
			if r.start.Before(e.stop.Add(-time.Second)) || r.start.After(e.cont) || r.ttfb < 0 {
				continue
			}
			n++
			past := r.start.Add(r.ttfb).Sub(e.cont)
			worst = max(worst, past)
			if past > soakStopSlack {
				late = append(late, fmt.Sprintf("%s (%s, started %+.2fs from the stop, headers %.2fs after the resume)",
					r.id, kindNames[r.kind], r.start.Sub(e.stop).Seconds(), past.Seconds()))
			}
		}
		lines = append(lines, fmt.Sprintf("turnout stopped %.1fs: %d requests met it, the last headers %.2fs after the resume",
			e.cont.Sub(e.stop).Seconds(), n, worst.Seconds()))
		if len(late) > 0 {
			s.t.Errorf("turnout stopped %.1fs: %d requests waited past %v after the resume: %s",
				e.cont.Sub(e.stop).Seconds(), len(late), soakStopSlack, strings.Join(late[:min(len(late), 5)], "; "))
		}
	}
	return lines
}

// soakTally sums what each turnout process counted before it stopped (its
// /metrics), for the checks of flow control and loads on demand.
type soakTally struct {
	critical, evilTenants, teamA, teamB, held, none float64
	loadsListed, loadsUnlisted, loadsLimited        float64
	abandoned                                       float64
	unlisted                                        []string
}

func (a *soakTally) add(t *testing.T, url string) {
	text := getMetrics(t, url)
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		i := strings.LastIndexByte(line, ' ')
		if i < 0 || strings.HasPrefix(line, "#") {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(line, "turnout_flow_requests_total{"):
			if strings.Contains(line, `class="critical"`) {
				a.critical += v
			}
			switch {
			case strings.Contains(line, `tenant="evil`):
				a.evilTenants += v
			case strings.Contains(line, `tenant="team-a"`):
				a.teamA += v
			case strings.Contains(line, `tenant="team-b"`):
				a.teamB += v
			case strings.Contains(line, `tenant="none"`):
				a.none += v
			}
			if strings.Contains(line, `outcome="released"`) || strings.Contains(line, `outcome="timed_out"`) {
				a.held += v
			}
		case strings.HasPrefix(line, "turnout_lora_loads_total{") && strings.Contains(line, `result="ok"`):
			if strings.Contains(line, `model="od-1"`) {
				a.loadsListed += v
			} else if v > 0 {
				a.loadsUnlisted += v
				a.unlisted = append(a.unlisted, line)
			}
		case strings.HasPrefix(line, "turnout_lora_loads_limited_total{"):
			a.loadsLimited += v
		case strings.HasPrefix(line, `turnout_completions_total{`) && strings.Contains(line, `result="abandoned"`):
			a.abandoned += v
		}
	}
}
