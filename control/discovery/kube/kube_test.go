package kube

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/turnout/turnout/internal/config"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/turnout/turnout/lab/testenv/kubetest"
)

const ns = "llm"

func ptr[T any](v T) *T { return &v }

// ep is an EndpointSlice endpoint for pod with conditions ready/serving/terminating.
func ep(pod, ip string, ready, serving, terminating bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{
		Addresses:  []string{ip},
		Conditions: discoveryv1.EndpointConditions{Ready: ptr(ready), Serving: ptr(serving), Terminating: ptr(terminating)},
		TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: pod},
	}
}

func slice(name, svc string, typ discoveryv1.AddressType, port string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: svc, "app": "vllm"}},
		AddressType: typ,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr(port), Port: ptr(int32(8000))}},
		Endpoints:   eps,
	}
}

func kubeCfg(t *testing.T, y string) *config.Config {
	t.Helper()
	c, err := config.ParseConfig([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

const twoPools = `
deployments:
  - name: pd
    pools:
      - role: prefill
        discovery: {kubernetes: {namespace: llm, service: vllm, port: http, role_label: vllm-role}}
      - role: decode
        discovery: {kubernetes: {namespace: llm, service: vllm, port: http, role_label: vllm-role, role_values: [decode, dec]}}
  - name: mix
    pools:
      - role: mixed
        discovery: {kubernetes: {namespace: llm, label_selector: "app=vllm,tier in (mixed)", port: "8000"}}
`

func startSource(t *testing.T, rc *rest.Config, cfg *config.Config) (*Source, *atomic.Int64) {
	t.Helper()
	cs, err := NewClient(rc)
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	s := New(Options{Client: cs, Notify: func() { n.Add(1) }, Namespace: "default"})
	if err := s.Configure(cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s, &n
}

// waitFor polls the source until check passes on its endpoints.
func waitFor(t *testing.T, s *Source, what string, check func(map[string][]config.EndpointConfig) bool) map[string][]config.EndpointConfig {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := s.Endpoints()
		if check(got) {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; have %+v", what, got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func names(eps []config.EndpointConfig) string {
	var b []string
	for _, e := range eps {
		s := e.Name + "=" + e.Address
		if e.Draining {
			s += "(draining)"
		}
		b = append(b, s)
	}
	return strings.Join(b, " ")
}

// TestSourceRealAPIServer runs the source against a real kube-apiserver with
// turnout's Role only: conditions, ports, role labels, bad slices.
func TestSourceRealAPIServer(t *testing.T) {
	c := kubetest.Start(t, "../../..", ns, "")
	ctx := context.Background()
	admin := c.Admin
	for _, p := range []struct{ name, role string }{{"p-0", "prefill"}, {"d-0", "decode"}, {"d-1", "dec"}, {"d-2", "decode"}, {"x-0", "other"}} {
		_, err := admin.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: p.name, Labels: map[string]string{"vllm-role": p.role}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "v", Image: "vllm"}}, AutomountServiceAccountToken: ptr(false)},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	create := func(es *discoveryv1.EndpointSlice) {
		t.Helper()
		if _, err := admin.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	create(slice("vllm-a", "vllm", discoveryv1.AddressTypeIPv4, "http",
		ep("p-0", "10.244.0.10", true, true, false),
		ep("d-0", "10.244.0.11", true, true, false),
		ep("d-1", "10.244.0.12", false, true, true),   // terminating, serving: draining
		ep("d-2", "10.244.0.13", false, false, false), // not ready: absent
		ep("x-0", "10.244.0.14", true, true, false),   // role in no pool
	))
	create(slice("vllm-ipv6", "vllm", discoveryv1.AddressTypeIPv6, "http", ep("d-0", "fd00::11", true, true, false)))
	create(slice("vllm-noport", "vllm", discoveryv1.AddressTypeIPv4, "grpc", ep("d-2", "10.244.0.13", true, true, false)))

	cfg := kubeCfg(t, twoPools)
	s, notified := startSource(t, c.RESTConfig(kubetest.TurnoutToken), cfg)
	if err := s.Probe(ctx); err != nil {
		t.Fatalf("the Role in deploy/kubernetes/rbac.yaml is not enough: %v", err)
	}
	got := waitFor(t, s, "prefill and decode pools", func(m map[string][]config.EndpointConfig) bool {
		return len(m["pd_prefill"]) == 1 && len(m["pd_decode"]) == 2
	})
	if n := names(got["pd_prefill"]); n != "p-0=10.244.0.10:8000" {
		t.Errorf("prefill: %s", n)
	}
	if n := names(got["pd_decode"]); n != "d-0=10.244.0.11:8000 d-1=10.244.0.12:8000(draining)" {
		t.Errorf("decode (IPv6 and port-less slices must be skipped, d-2 absent): %s", n)
	}
	if len(got["mix_mixed"]) != 0 {
		t.Errorf("mixed pool selects tier=mixed slices only: %s", names(got["mix_mixed"]))
	}
	if notified.Load() == 0 {
		t.Error("no notification")
	}
	if v := s.Vanished(); !v["mix_mixed"] || v["pd_decode"] || v["pd_prefill"] {
		t.Errorf("vanished %v: want only mix_mixed (no tier=mixed slice yet)", v)
	}

	// A mixed slice selected by labels, with a duplicate address in a
	// second slice and a numeric port.
	mix := slice("mix-a", "mix", discoveryv1.AddressTypeIPv4, "http",
		ep("m-0", "10.244.0.20", true, true, false), ep("m-1", "10.244.0.21", true, true, false))
	mix.Labels["tier"] = "mixed"
	create(mix)
	dup := slice("mix-b", "mix", discoveryv1.AddressTypeIPv4, "http",
		ep("m-9", "10.244.0.20", true, true, false), ep("m-1", "10.244.0.21", true, true, false))
	dup.Labels["tier"] = "mixed"
	create(dup)
	got = waitFor(t, s, "mixed pool", func(m map[string][]config.EndpointConfig) bool { return len(m["mix_mixed"]) >= 2 })
	time.Sleep(200 * time.Millisecond)
	got = s.Endpoints()
	if n := names(got["mix_mixed"]); n != "m-0=10.244.0.20:8000 m-1=10.244.0.21:8000" {
		t.Errorf("mixed (duplicate address under another name skipped, same pod in two slices once): %s", n)
	}

	// Terminating then gone.
	es, err := admin.DiscoveryV1().EndpointSlices(ns).Get(ctx, "vllm-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	es.Endpoints[1] = ep("d-0", "10.244.0.11", false, true, true)
	if _, err := admin.DiscoveryV1().EndpointSlices(ns).Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, s, "d-0 draining", func(m map[string][]config.EndpointConfig) bool {
		return names(m["pd_decode"]) == "d-0=10.244.0.11:8000(draining) d-1=10.244.0.12:8000(draining)"
	})
	if err := admin.DiscoveryV1().EndpointSlices(ns).Delete(ctx, "vllm-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, s, "decode pool empty", func(m map[string][]config.EndpointConfig) bool {
		_, ok := m["pd_decode"]
		return ok && len(m["pd_decode"]) == 0
	})
	// Empty, but slices remain (they list nothing usable): not vanished.
	if v := s.Vanished(); v["pd_decode"] || v["mix_mixed"] {
		t.Errorf("vanished %v with vllm-ipv6, vllm-noport and mix-a/b left", v)
	}
	for _, name := range []string{"vllm-ipv6", "vllm-noport"} {
		if err := admin.DiscoveryV1().EndpointSlices(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for v := s.Vanished(); !v["pd_decode"] || !v["pd_prefill"]; v = s.Vanished() {
		if time.Now().After(deadline) {
			t.Fatalf("vanished %v after every vllm slice was deleted, want pd_decode and pd_prefill", v)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSourceRBACDenied: a token without the Role gets a clear forbidden
// error and the pools stay unknown (not synced), never half-filled.
func TestSourceRBACDenied(t *testing.T) {
	c := kubetest.Start(t, "../../..", ns, "")
	s, _ := startSource(t, c.RESTConfig(kubetest.NobodyToken), kubeCfg(t, twoPools))
	err := s.Probe(context.Background())
	if err == nil || !apierrors.IsForbidden(errorsUnwrapForbidden(err)) {
		t.Fatalf("want a forbidden error, got %v", err)
	}
	time.Sleep(500 * time.Millisecond)
	if s.Synced() {
		t.Error("synced without permission")
	}
	if m := s.Endpoints(); len(m) != 0 {
		t.Errorf("pools reported without permission: %v", m)
	}
}

// errorsUnwrapForbidden finds the API status error inside a joined error.
func errorsUnwrapForbidden(err error) error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			return errorsUnwrapForbidden(e)
		}
	}
	for e := err; e != nil; {
		if apierrors.IsForbidden(e) {
			return e
		}
		u, ok := e.(interface{ Unwrap() error })
		if !ok {
			break
		}
		e = u.Unwrap()
	}
	return err
}

func TestCheckNamesTheField(t *testing.T) {
	cfg := kubeCfg(t, `
deployments:
  - name: x
    pools:
      - role: mixed
        discovery: {kubernetes: {label_selector: "app in (vllm", port: http}}
`)
	err := Check(cfg)
	if err == nil || !strings.Contains(err.Error(), "deployments[0].pools[0].discovery.kubernetes.label_selector") {
		t.Fatalf("want an error naming the field, got %v", err)
	}
}

func TestConditions(t *testing.T) {
	b := func(v bool) *bool { return &v }
	for _, tc := range []struct {
		c    discoveryv1.EndpointConditions
		want int
	}{
		{discoveryv1.EndpointConditions{}, stateReady}, // unknown reads as ready
		{discoveryv1.EndpointConditions{Ready: b(true)}, stateReady},
		{discoveryv1.EndpointConditions{Ready: b(false)}, stateAbsent},
		{discoveryv1.EndpointConditions{Ready: b(false), Serving: b(true), Terminating: b(true)}, stateDraining},
		{discoveryv1.EndpointConditions{Ready: b(false), Serving: b(false), Terminating: b(true)}, stateAbsent},
		{discoveryv1.EndpointConditions{Ready: b(true), Terminating: b(true)}, stateDraining},
	} {
		if got := conditions(tc.c); got != tc.want {
			t.Errorf("%+v: got %d want %d", tc.c, got, tc.want)
		}
	}
}

func TestEndpointNames(t *testing.T) {
	long := strings.Repeat("a", 80)
	n := endpointName(ns, &corev1.ObjectReference{Kind: "Pod", Name: long}, nil, 0)
	if !config.ValidName(n) || n != endpointName(ns, &corev1.ObjectReference{Kind: "Pod", Name: long}, nil, 0) {
		t.Errorf("long pod name -> %q: must be valid and stable", n)
	}
	if n := endpointName(ns, &corev1.ObjectReference{Kind: "Pod", Name: "vllm-0"}, nil, 0); n != "vllm-0" {
		t.Errorf("pod name kept: %q", n)
	}
}
