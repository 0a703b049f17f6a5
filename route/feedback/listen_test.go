package feedback

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/lab/testenv/freeport"
	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/contract"
	"github.com/turnout/turnout/route/internal/routetest"
)

// openIDs routes n requests and returns their decision ids.
func openIDs(t *testing.T, s *testServer, n int) []string {
	t.Helper()
	var ids []string
	for i := 0; i < n; i++ {
		id := hdr(do(s, chatBody("llama", "", "x")), contract.HdrDecision)
		if len(id) != 16 {
			t.Fatalf("decision id %q is not 16 hex digits", id)
		}
		ids = append(ids, id)
	}
	return ids
}

func totalInflight(s *testServer) (n int64) {
	for _, p := range s.Snapshot().Pools() {
		for _, e := range p.Endpoints {
			n += e.Inflight()
		}
	}
	return n
}

// Finding 6: one's own decision id must not reveal the live ones. With
// sequential ids, "mine + k" closed other clients' decisions.
func TestDecisionIDsUnguessable(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(fourEndpoints, "least-request"))
	ids := openIDs(t, s, 64)
	mine, _ := contract.ParseDecisionID([]byte(ids[0]))
	live := totalInflight(s)
	for k := uint64(1); k <= 4096; k++ {
		for _, guess := range []uint64{mine + k, mine - k, mine ^ k, mine + k<<16, mine + k<<32} {
			line := fmt.Sprintf("turnout-done id=%016x srv=a status=200 ms=1", guess)
			if s.Line([]byte(line)) {
				t.Fatalf("guessed id %016x (own %016x + %d) closed a live decision", guess, mine, k)
			}
		}
	}
	if totalInflight(s) != live {
		t.Fatalf("inflight %d after guessing, want %d", totalInflight(s), live)
	}
	// The ids still close their own decisions, and only once.
	for _, id := range ids {
		if !s.Line([]byte("turnout-done id=" + id + " srv=a status=200 ms=1")) {
			t.Fatalf("genuine id %s not accepted", id)
		}
	}
	if totalInflight(s) != 0 {
		t.Fatalf("inflight %d after genuine completions", totalInflight(s))
	}
}

const feedbackCfg = routetest.FeedbackCfg

// listen runs ListenFeedback and returns a connected UDP client.
func listenFeedback(t *testing.T, s *testServer, addr string) net.Conn {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- s.Listen(ctx, addr) }()
	t.Cleanup(func() { cancel(); <-errc })
	c, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Finding 6: a datagram from a source outside feedback.sources closes nothing.
func TestFeedbackSourceChecked(t *testing.T) {
	for _, tc := range []struct {
		name, sources string
		closes        bool
	}{
		{"loopback allowed by default", "", true},
		{"only another network allowed", "10.0.0.0/8", false},
		{"this address listed", "127.0.0.1", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := freeport.Addr(t)
			s := mustServer(t, fmt.Sprintf(feedbackCfg, addr, tc.sources, ""))
			c := listenFeedback(t, s, addr)
			ids := openIDs(t, s, 3)
			var b bytes.Buffer
			for _, id := range ids {
				fmt.Fprintf(&b, "<134>Nov 21 10:00:00 haproxy[1]: turnout-done id=%s srv=a status=200 ms=3 ttfb=1\n", id)
			}
			deadline := time.Now().Add(3 * time.Second)
			for time.Now().Before(deadline) {
				_, _ = c.Write(b.Bytes()) // refused until the listener is up
				if totalInflight(s) == 0 || s.rejected.Load() > 0 {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if got := totalInflight(s) == 0; got != tc.closes {
				t.Fatalf("decisions closed=%v, want %v (rejected %d)", got, tc.closes, s.rejected.Load())
			}
			if !tc.closes && completed(s) != 0 {
				t.Fatal("a completion was counted from a rejected source")
			}
		})
	}
}

func TestFeedbackDatagramSource(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(feedbackCfg, "127.0.0.1:5140", "", ""))
	ids := openIDs(t, s, 2)
	s.Datagram(netip.MustParseAddr("192.0.2.7"), []byte("turnout-done id="+ids[0]+" srv=a status=200 ms=1"))
	if totalInflight(s) != 2 || s.rejected.Load() != 1 {
		t.Fatalf("foreign source: inflight %d rejected %d", totalInflight(s), s.rejected.Load())
	}
	s.Datagram(netip.MustParseAddr("::ffff:127.0.0.1"), []byte("turnout-done id="+ids[0]+" srv=a status=200 ms=1\nturnout-done id="+ids[1]+" srv=b status=200 ms=1\n"))
	if totalInflight(s) != 0 {
		t.Fatalf("loopback (v4-mapped) source: inflight %d", totalInflight(s))
	}
}

// Finding 6: with feedback.token, a line without it (or with another) is dropped.
func TestFeedbackToken(t *testing.T) {
	const tok = "s3cret-token-0123456789"
	s := mustServer(t, fmt.Sprintf(feedbackCfg, "127.0.0.1:5140", "", tok))
	ids := openIDs(t, s, 1)
	for _, line := range []string{
		"turnout-done id=" + ids[0] + " srv=a status=200 ms=1",
		"turnout-done id=" + ids[0] + " srv=a status=200 ms=1 tok=wrong-token-0123456789",
		"turnout-done id=" + ids[0] + " srv=a status=200 ms=1 tok=" + tok[:len(tok)-1],
	} {
		if s.Line([]byte(line)) {
			t.Fatalf("line without the right token closed a decision: %q", line)
		}
	}
	if !s.Line([]byte("turnout-done id=" + ids[0] + " srv=a tok=" + tok + " status=200 ms=1")) {
		t.Fatal("line with the token not accepted")
	}
	if s.rejected.Load() != 3 {
		t.Fatalf("rejected %d, want 3", s.rejected.Load())
	}
	if contract.FeedbackAuthField(s.Snapshot().Config) != "tok="+tok {
		t.Fatalf("auth field %q", contract.FeedbackAuthField(s.Snapshot().Config))
	}
}

func TestFeedbackExposureWarning(t *testing.T) {
	for _, tc := range []struct {
		host string
		warn bool
	}{{"127.0.0.1", false}, {"0.0.0.0", true}} {
		var logs bytes.Buffer
		l := zerolog.New(&logs)
		pc, err := net.ListenPacket("udp", tc.host+":0")
		if err != nil {
			t.Fatal(err)
		}
		addr := pc.LocalAddr().String()
		pc.Close()
		cfg := mustConfig(t, fmt.Sprintf(feedbackCfg, addr, "", ""))
		s, err := newServer(t, cfg, route.Options{Log: &l})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.Listen(ctx, addr) }()
		time.Sleep(50 * time.Millisecond)
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		got := strings.Contains(logs.String(), "feedback listens beyond loopback")
		if got != tc.warn {
			t.Fatalf("%s: warning=%v, want %v; log:\n%s", tc.host, got, tc.warn, logs.String())
		}
	}
}

func TestFeedbackConfigValidation(t *testing.T) {
	for _, tc := range []struct{ yaml, field string }{
		{"feedback: {sources: [not-an-ip]}", "feedback.sources[0]"},
		{"feedback: {token: short}", "feedback.token"},
		{"feedback: {token: \"has space in it 0123456789\"}", "feedback.token"},
		{"health: {stall: {budget: 10ms}}", "health.stall.budget"},
		{"health: {stall: {scale: 0.5}}", "health.stall.scale"},
		{"health: {stall: {scale: 1000}}", "health.stall.scale"},
		{"health: {stall: {floor: 10ms}}", "health.stall.floor"},
	} {
		_, err := config.ParseConfig([]byte(tc.yaml + "\ndeployments: [{name: x, pools: [{endpoints: [{name: a, address: 127.0.0.1:1}]}]}]\n"))
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: error %v does not name %s", tc.yaml, err, tc.field)
		}
	}
	c := mustConfig(t, "feedback: {syslog: 10.0.0.5:5140}\ndeployments: [{name: x, pools: [{endpoints: [{name: a, address: 127.0.0.1:1}]}]}]\n")
	if strings.Join(c.Feedback.Sources, ",") != "127.0.0.0/8,::1,10.0.0.5" {
		t.Fatalf("default sources %v", c.Feedback.Sources)
	}
}

// Proxy log lines in both syslog forms (HAProxy RFC3164, nginx RFC5424)
// close their decisions once; lines without a decision close nothing.
func TestCompletionLines(t *testing.T) {
	s := mustServer(t, fmt.Sprintf(fourEndpoints, "least-request"))
	var ids []string
	for i := 0; i < 40; i++ {
		ids = append(ids, hdr(do(s, chatBody("llama", "", "x")), contract.HdrDecision))
	}
	total := func() (n int64) {
		for _, e := range s.Snapshot().Deployments[0].Serve.Endpoints {
			n += e.Inflight()
		}
		return n
	}
	if total() != 40 {
		t.Fatalf("inflight %d, want 40", total())
	}
	for i, id := range ids {
		line := fmt.Sprintf("<134>Nov 21 10:00:00 haproxy[1]: turnout-done id=%s srv=a status=200 ms=12", id)
		if i%2 == 0 {
			line = fmt.Sprintf("<190>1 2026-11-21T10:00:00Z host nginx - - - turnout-done id=%s srv=b status=200 ms=3", id)
		}
		if !s.Line([]byte(line)) {
			t.Fatalf("line %q not accepted", line)
		}
	}
	if total() != 0 {
		t.Fatalf("inflight %d after completions", total())
	}
	if s.Line([]byte("turnout-done id=" + ids[0] + " srv=a")) {
		t.Fatal("duplicate completion accepted")
	}
	if s.Line([]byte("turnout-done id=- srv=a status=200")) || s.Line([]byte("some other log line")) {
		t.Fatal("line without a decision accepted")
	}
}
