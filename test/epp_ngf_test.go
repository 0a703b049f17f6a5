//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// NGINX Gateway Fabric's shim asks per request and never reports the
// response: NGF proxies to the header's whole value, so turnout lists the
// primary alone (epp.fallbacks: 0) and each pick is one replica's ip:port;
// each stream ends as soon as the shim has closed its side, and the pick
// serves the request when nginx proxies it there. The decisions stay open
// (counted in flight) until decision_ttl expires them: nothing completes
// them, nothing leaks.
func TestEPP_E2E_NGFShim(t *testing.T) {
	const n = 12
	ms, _ := eppMocks(t, 3)
	s := startEPPStack(t, eppSpec{mocks: ms, top: "decision_ttl: 3s\n", epp: ", fallbacks: 0"})
	host, port, _ := net.SplitHostPort(s.eppAddr)
	served := map[string]int{}
	var lastPick time.Time
	for i := range n {
		body := chatRequest(fmt.Sprintf("ngf %d", i)).Body
		// What the shim's http.Request carries from the NJS fetch: the
		// client's headers, Go-canonicalised (Host is not among them),
		// and the EPP's address.
		hdr := http.Header{
			"Content-Type":   {"application/json"},
			"Content-Length": {strconv.Itoa(len(body))},
			"Accept":         {"text/event-stream"},
			"X-Epp-Host":     {host},
			"X-Epp-Port":     {port},
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		dest, refused, err := ngfPick(ctx, s.eppAddr, hdr, body)
		cancel()
		if err != nil || refused != 0 {
			t.Fatalf("pick %d: %q refused %d: %v (a stream the server did not end times out here)", i, dest, refused, err)
		}
		lastPick = time.Now()
		if _, ok := s.names[dest]; !ok {
			t.Fatalf("pick %q is not one replica's ip:port (%v)", dest, s.names)
		}
		// nginx then proxies the request to the header's value.
		res, err := http.Post("http://"+dest+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
		if err != nil {
			t.Fatal(err)
		}
		ev, err := readChatEvents(res.Body)
		res.Body.Close()
		if err != nil || res.StatusCode != 200 || !ev.done || res.Header.Get("X-Replica") != s.names[dest] {
			t.Fatalf("proxied to %s: %d %s %+v %v", dest, res.StatusCode, res.Header.Get("X-Replica"), ev, err)
		}
		served[dest]++
	}
	if len(served) != len(ms) {
		t.Fatalf("round-robin over the shim served %v", served)
	}
	// No response phase: the decisions are open...
	inflight := s.metric(t, "turnout_endpoint_inflight")
	if time.Since(lastPick) < 2*time.Second && inflight < 1 {
		t.Fatalf("%v in flight just after the last pick: the shim's decisions are not kept open", inflight)
	}
	// ...until decision_ttl closes every one of them as expired.
	Eventually(t, 15*time.Second, "decision_ttl to expire the shim's decisions", func() bool {
		v, err := Metric(t, s.tu.URL+"/metrics", "turnout_completions_total", `result="expired"`)
		return err == nil && v == n
	})
	s.waitClosed(t)
	if v := s.metric(t, "turnout_completions_total", `result="completed"`); v != 0 {
		t.Fatalf("%v decisions completed without a response phase", v)
	}
}
