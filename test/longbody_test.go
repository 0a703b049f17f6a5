//go:build e2e

package e2e

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/turnout/turnout/internal/config"

	"github.com/turnout/turnout/lab/mock"
)

// A prompt far larger than HAProxy's buffer: the proxy hands turnout a
// prefix (HAProxy: one tune.bufsize buffer, 64 KiB by default) or the whole
// body (nginx body mode, up to max_body), turnout routes on what it got, and
// the replica still receives every byte.

// longPromptBlock is policyPrefix's block_bytes: turnout_prefix_blocks_total
// times this is how much prompt turnout saw.
const longPromptBlock = 64

// longText returns n bytes of words derived from seed.
func longText(seed, n int) string {
	var b strings.Builder
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "w%d_%d ", seed, i)
	}
	return b.String()[:n]
}

// checkLongPrompt sends four ~200 KiB chat requests sharing a 150 KiB system
// prompt. Every one must be decided by turnout (affinity decisions counted
// in its metrics, all on one replica: the shared prefix matched), and the
// replica must log each body byte for byte. seenMax bounds how much prompt
// turnout may have seen per request (0: it must have seen nearly all of it).
func checkLongPrompt(t *testing.T, s frontend, model, turnoutURL string, seenMax int) {
	t.Helper()
	system := longText(1, 150<<10)
	pool := model + "_mixed"
	metric := func(name string, filters ...string) float64 {
		t.Helper()
		v, err := Metric(t, turnoutURL+"/metrics", name, filters...)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	affinity0 := metric("turnout_decisions_total", `pool="`+pool+`"`, `outcome="affinity"`)
	var home string
	var sent [][]byte
	for i := range 4 {
		body := chatBody(model, system, longText(100+i, 50<<10), false)
		if len(body) < 200<<10 {
			t.Fatalf("body is %d bytes, want >= 200 KiB", len(body))
		}
		blocks0 := metric("turnout_prefix_blocks_total", `pool="`+pool+`"`)
		r := s.post(t, mock.PathChat, body, nil)
		if r.Status != 200 {
			t.Fatalf("long prompt %d: status %d: %.300s", i, r.Status, r.Body)
		}
		seen := int(metric("turnout_prefix_blocks_total", `pool="`+pool+`"`)-blocks0) * longPromptBlock
		promptLen := len(system) + 50<<10
		switch {
		case seen == 0:
			t.Fatalf("long prompt %d: turnout saw no prompt (not routed by turnout?)", i)
		case seenMax > 0 && seen > seenMax:
			t.Errorf("long prompt %d: turnout hashed %d bytes of prompt, want a prefix <= %d", i, seen, seenMax)
		case seenMax == 0 && seen < promptLen*9/10:
			t.Errorf("long prompt %d: turnout hashed %d of %d prompt bytes, want nearly all", i, seen, promptLen)
		}
		rep := r.Header.Get("X-Replica")
		t.Logf("long prompt %d (%d bytes): turnout hashed %d bytes of prompt, replica %s", i, len(body), seen, rep)
		if home == "" {
			home = rep
		}
		if rep != home {
			t.Errorf("long prompt %d went to %s, the first to %s: the shared prefix did not route it", i, rep, home)
		}
		sent = append(sent, body)
	}
	if got := metric("turnout_decisions_total", `pool="`+pool+`"`, `outcome="affinity"`) - affinity0; got < 3 {
		t.Errorf("%v affinity decisions for the 3 repeated prefixes, want >= 3", got)
	}
	// The replica got every body whole (the mock logs bodies up to 1 MiB).
	var m *Mock
	for _, c := range s.replicas(model) {
		if c.Name == home {
			m = c
		}
	}
	if m == nil {
		t.Fatalf("no replica %q", home)
	}
	logged := hpdRequests(t, m)
	for i, want := range sent {
		found := false
		for _, e := range logged {
			// The mock trims outer whitespace of a JSON body; chatBody has none.
			if bytes.Equal(e.Body, want) {
				found = true
				break
			}
		}
		if !found {
			sizes := make([]int, len(logged))
			for k, e := range logged {
				sizes[k] = len(e.Body)
			}
			t.Errorf("replica %s never received long prompt %d whole (%d bytes); logged body sizes %v", home, i, len(want), sizes)
		}
	}
}

// TestHAProxyLongPrompt runs checkLongPrompt through HAProxy on each path:
// the default SPOE agent (unix socket) and the Lua action. Both hand
// turnout the first route_body bytes (48 KiB by default; the rendered
// tune.bufsize is 64 KiB) and HAProxy forwards the rest once its buffer is
// full.
func TestHAProxyLongPrompt(t *testing.T) {
	for _, tc := range []struct{ name, spoe string }{{"SPOE", spoeDefault}, {"Lua", ""}} {
		t.Run(tc.name, func(t *testing.T) {
			s := startStackWith(t, "open", tc.spoe, depSpec{name: "llama", policy: policyPrefix, mocks: mocks(t, "long", 3, nil)})
			checkLongPrompt(t, s, "llama", "http://"+s.turnoutAddr, config.DefaultRouteBody)
		})
	}
}

// TestNginxLongPrompt: nginx body mode reads the whole body into memory
// (max_body 256 KiB here), hands turnout its first route_body bytes, as
// HAProxy does, and proxies all of it.
func TestNginxLongPrompt(t *testing.T) {
	s := startNginxStack(t, "open", ndep{name: "llama", policy: policyPrefix, mode: "body", mocks: mocks(t, "nlong", 3, nil)})
	checkLongPrompt(t, s, "llama", "http://"+s.turnoutAddr, config.DefaultRouteBody)
}
