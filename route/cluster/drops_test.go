package cluster

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/httpapi"
)

// Issue 28 item 9: hand-off drops are visible in /readyz?verbose and
// logged (rate-limited), not only counted.
func TestSyncDropsVisible(t *testing.T) {
	cfg, err := config.ParseConfig([]byte(fmt.Sprintf(fourEndpoints, "nats://127.0.0.1:1", "n")))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Cluster.Queue = 16
	srv, err := route.New(cfg, route.Options{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	var logs bytes.Buffer
	l := zerolog.New(&logs)
	s, err := New(srv, cfg.Cluster, &l)
	if err != nil {
		t.Fatal(err)
	}
	defer s.nc.Close()
	n := &node{srv: srv, api: httpapi.New(srv), sync: s}
	for i := 0; i < 40; i++ { // Run is not started: nothing drains the queue
		decide(t, n, routeCtx(prompt(i), ""))
	}
	var b strings.Builder
	srv.Extras().WriteReadinessNotes(&b)
	if !strings.Contains(b.String(), "cluster: NATS UNREACHABLE; 0 prefix decisions shared, 24 dropped (100.0%: queue full 24") {
		t.Fatalf("readyz?verbose notes:\n%s", b.String())
	}
	now := time.Now()
	s.noteDrops(now)
	s.noteDrops(now.Add(time.Second)) // within the minute: not logged again
	if c := strings.Count(logs.String(), "not shared with peers"); c != 1 || !strings.Contains(logs.String(), `"dropped":24`) {
		t.Fatalf("%d warnings:\n%s", c, logs.String())
	}
}
