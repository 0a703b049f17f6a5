//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/lab/mock"
)

// depSpec is one deployment of a test stack.
type depSpec struct {
	name   string
	policy string // YAML flow mapping for policy:
	mocks  []*Mock
	// extra adds YAML flow-map entries to an endpoint (e.g. kv_events).
	extra func(m *Mock) string
	// depYAML adds "key: value" lines to the deployment (e.g. kv_events_bind).
	depYAML []string
	// prefill set: a prefill/decode deployment, mocks its decode pool.
	prefill []*Mock
	// models the deployment accepts (default: its name).
	models []string
}

// pools is the deployment's pools as backend name -> replicas.
func (d depSpec) pools() map[string][]*Mock {
	if d.prefill == nil {
		return map[string][]*Mock{config.PoolName(d.name, config.RoleMixed): d.mocks}
	}
	return map[string][]*Mock{config.PoolName(d.name, config.RolePrefill): d.prefill, config.PoolName(d.name, config.RoleDecode): d.mocks}
}

// hstack is mocks + turnout + HAProxy wired together.
type hstack struct {
	t                                *testing.T
	dir, turnoutAddr, haAddr, syslog string
	failMode                         string
	spoeAddr                         string // HAProxy's path to turnout, see haproxyPathYAML
	haExtra                          string // more haproxy: flow-map entries ("l7_retries: true")
	deps                             []depSpec
	T                                *Turnout
	H                                *HAProxy
	client                           *http.Client
}

func (s *hstack) yaml() string {
	var b strings.Builder
	fmt.Fprintf(&b, `listen: %s
session_headers: [x-session-id]
max_body: 262144
fallbacks: 2
feedback: {syslog: %s}
health: {interval: 300ms, timeout: 300ms}
proxy:
  fail_mode: %s
  route_timeout: 500ms
  breaker_failures: 3
  breaker_cooldown: 30s
haproxy: {listen: %q, dir: %q, drain_timeout: 3s, nbthread: 2, %s%s}
deployments:
`, s.turnoutAddr, s.syslog, s.failMode, s.haAddr, s.dir, haproxyPathYAML(s.spoeAddr), s.haExtra)
	for _, d := range s.deps {
		models := d.name
		if len(d.models) > 0 {
			models = strings.Join(d.models, ", ")
		}
		fmt.Fprintf(&b, "  - name: %s\n    models: [%s]\n    policy: %s\n", d.name, models, d.policy)
		for _, l := range d.depYAML {
			fmt.Fprintf(&b, "    %s\n", l)
		}
		b.WriteString("    pools:\n")
		pool := func(role string, ms []*Mock) {
			fmt.Fprintf(&b, "      - role: %s\n        endpoints:\n", role)
			for _, m := range ms {
				more := ""
				if d.extra != nil {
					more = ", " + d.extra(m)
				}
				fmt.Fprintf(&b, "          - {name: %s, address: %q%s}\n", m.Name, m.Addr, more)
			}
		}
		if d.prefill == nil {
			pool(config.RoleMixed, d.mocks)
			continue
		}
		pool(config.RolePrefill, d.prefill)
		pool(config.RoleDecode, d.mocks)
	}
	return b.String()
}

// spoeDefault as a stack's spoeAddr renders the default path: SPOE with the
// agent on the socket next to the rendered files.
const spoeDefault = "default"

// haproxyPathYAML is the haproxy: flow-map entry that picks how HAProxy asks
// turnout: "" the Lua action, spoeDefault the default SPOE socket, else SPOE
// at that address.
func haproxyPathYAML(spoeAddr string) string {
	switch spoeAddr {
	case "":
		return "path: lua"
	case spoeDefault:
		return "path: spoe"
	}
	return fmt.Sprintf("spoe: %q", spoeAddr)
}

// startStack starts turnout with --haproxy-dir (its first sync writes the
// HAProxy files while HAProxy is not running yet), then HAProxy on them.
func startStack(t *testing.T, failMode string, deps ...depSpec) *hstack {
	return startStackWith(t, failMode, "", deps...)
}

// startStackWith is startStack with HAProxy asking turnout over SPOE at
// spoeAddr (haproxy.spoe) instead of the Lua action, when spoeAddr is set.
func startStackWith(t *testing.T, failMode, spoeAddr string, deps ...depSpec) *hstack {
	t.Helper()
	return startStackHA(t, failMode, spoeAddr, "", deps...)
}

// startStackHA is startStackWith with haExtra (", key: value" entries)
// added to the haproxy: flow map.
func startStackHA(t *testing.T, failMode, spoeAddr, haExtra string, deps ...depSpec) *hstack {
	t.Helper()
	NeedHAProxy(t)
	s := &hstack{
		t: t, dir: t.TempDir(), turnoutAddr: FreeAddr(t), haAddr: FreeAddr(t), syslog: FreeUDPAddr(t),
		failMode: failMode, spoeAddr: spoeAddr, haExtra: haExtra, deps: deps,
		client: &http.Client{Timeout: 30 * time.Second},
	}
	s.T = StartTurnout(t, s.turnoutAddr, s.yaml(), "--haproxy-dir", s.dir, "--watch", "100ms")
	s.H = StartRenderedHAProxy(t, s.dir, s.haAddr)
	var ids []string
	for _, d := range deps {
		for be, ms := range d.pools() {
			for _, m := range ms {
				ids = append(ids, be+"/"+m.Name)
			}
		}
	}
	s.H.WaitServersUp(t, ids...)
	return s
}

func (s *hstack) post(t *testing.T, path string, body []byte, hdr map[string]string) *Response {
	t.Helper()
	r, err := Post(context.Background(), s.client, s.H.URL+path, body, hdr)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	return r
}

func chatBody(model, system, user string, stream bool) []byte {
	b, _ := json.Marshal(map[string]any{
		"model": model,
		"messages": []map[string]string{
			{"role": "system", "content": system},
			{"role": "user", "content": user},
		},
		"max_tokens": 2,
		"stream":     stream,
	})
	return b
}

func mocks(t *testing.T, prefix string, n int, edit func(*mock.Config)) []*Mock {
	out := make([]*Mock, n)
	for i := range out {
		out[i] = StartMock(t, fmt.Sprintf("%s-%d", prefix, i), edit)
	}
	return out
}

const (
	policySession = "{name: session-hash}"
	policyPrefix  = "{name: prefix-affinity, params: {block_bytes: 64, match_threshold: 0.5, balance_abs: 8, balance_rel: 1.5}}"
	policyLeast   = "{name: least-request}"
)

// TestHAProxy runs the checks that share one stack: three deployments
// (session-hash, prefix-affinity, a slow streaming replica) behind one HAProxy.
func TestHAProxy(t *testing.T) { testHAProxy(t, "") }

// TestHAProxySPOE runs the same checks with HAProxy asking turnout over SPOE.
func TestHAProxySPOE(t *testing.T) { testHAProxy(t, FreeAddr(t)) }

func testHAProxy(t *testing.T, spoeAddr string) {
	s := startStackWith(t, "open", spoeAddr,
		depSpec{name: "chat", policy: policySession, mocks: mocks(t, "chat", 3, nil)},
		depSpec{name: "llama", policy: policyPrefix, mocks: mocks(t, "llama", 3, nil)},
		depSpec{name: "stream", policy: policyLeast, mocks: mocks(t, "stream", 1, func(c *mock.Config) {
			c.TimeScale = 1
			c.TTFTOverhead = 20 * time.Millisecond
			c.PerTokenPrefill = 0
			c.InterTokenLatency = 100 * time.Millisecond
		})},
	)
	t.Run("SessionSpellings", func(t *testing.T) { checkSessionSpellings(t, s, "chat", nil) })
	t.Run("PrefixRouting", func(t *testing.T) { checkPrefixRouting(t, s, "llama") })
	t.Run("StreamingNotBuffered", func(t *testing.T) { testStreaming(t, s) })
	t.Run("UnknownModelAndGarbage", func(t *testing.T) { testRefusals(t, s) })
	t.Run("SpoofedServerIgnored", func(t *testing.T) { testSpoof(t, s) })
	t.Run("OpenAINodeClient", func(t *testing.T) { checkOpenAINode(t, s.H.URL, "llama") })
	t.Run("PathGuard", func(t *testing.T) { checkPathGuard(t, s, "chat", nil) })
	t.Run("ClientInputsStripped", func(t *testing.T) { checkClientInputsStripped(t, s, "chat", nil) })
	t.Run("LargeHeaders", func(t *testing.T) { checkLargeHeaders(t, s, "chat", nil) })
	t.Run("LongModelRefused", func(t *testing.T) { checkLongModelRefused(t, s, nil) })
	t.Run("InflightBackToZero", func(t *testing.T) { testInflight(t, s) })
}
