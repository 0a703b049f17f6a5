package deploy_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/lab/testenv/kubetest"
	"github.com/turnout/turnout/route/epp"
)

// checkEPPPod checks a pod of the epp profile: turnout alone (the gateway
// moves the bytes), its ext_proc and plaintext health listeners as named
// container ports, gRPC probes of the protocol's health services on the
// health port, and with mode files the certificate turnout reads inside a
// mounted Secret.
func checkEPPPod(p *pod) error {
	spec := &p.dep.Spec.Template.Spec
	tu := container(spec, "turnout")
	var errs []error
	if len(spec.Containers) != 1 {
		errs = append(errs, fmt.Errorf("epp: %d containers, want turnout alone", len(spec.Containers)))
	}
	if spec.ShareProcessNamespace != nil && *spec.ShareProcessNamespace {
		errs = append(errs, errors.New("epp: shareProcessNamespace is for signalling a proxy; there is none"))
	}
	for _, a := range tu.Args {
		if strings.HasPrefix(a, "--haproxy-dir") || strings.HasPrefix(a, "--nginx-dir") {
			errs = append(errs, fmt.Errorf("epp: turnout runs with %s: it would render and sync a proxy", a))
		}
	}
	for name, addr := range map[string]string{"grpc": p.cfg.EPP.Listen, "grpc-health": p.cfg.EPP.HealthListen} {
		n, err := containerPort(tu, name)
		switch {
		case err != nil:
			errs = append(errs, err)
		case addr == "" || loopback(addr) || port(addr) != n:
			errs = append(errs, fmt.Errorf("epp: container port %s is %d, turnout listens on %q", name, n, addr))
		}
	}
	for svc, pr := range map[string]*corev1.Probe{epp.HealthLiveness: tu.LivenessProbe, epp.HealthReadiness: tu.ReadinessProbe} {
		if pr == nil || pr.GRPC == nil || pr.GRPC.Service == nil || *pr.GRPC.Service != svc {
			errs = append(errs, fmt.Errorf("epp: turnout's %s probe is %+v, want gRPC health service %q", svc, pr, svc))
		}
	}
	if p.cfg.EPP.TLS.Mode == config.EPPTLSFiles {
		dir := filepath.Dir(p.cfg.EPP.TLS.CertFile)
		var vol string
		for _, m := range tu.VolumeMounts {
			if m.MountPath == dir {
				vol = m.Name
			}
		}
		var secret bool
		for _, v := range spec.Volumes {
			secret = secret || (v.Name == vol && v.Secret != nil && v.Secret.SecretName != "")
		}
		if !secret || filepath.Dir(p.cfg.EPP.TLS.KeyFile) != dir {
			errs = append(errs, fmt.Errorf("epp.tls files: %s and %s are not in a mounted Secret", p.cfg.EPP.TLS.CertFile, p.cfg.EPP.TLS.KeyFile))
		}
	}
	for _, c := range spec.Containers {
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
			errs = append(errs, fmt.Errorf("container %s: cpu and memory requests and a memory limit are required", c.Name))
		}
	}
	return errors.Join(errs...)
}

// eppRender is the epp profile's Service and InferencePool (nil when none).
type eppRender struct {
	svc  *corev1.Service
	pool *unstructured.Unstructured
}

func eppObjects(t *testing.T, objs []*unstructured.Unstructured) eppRender {
	t.Helper()
	var r eppRender
	for _, o := range objs {
		switch o.GetKind() {
		case "Service":
			r.svc = &corev1.Service{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, r.svc); err != nil {
				t.Fatal(err)
			}
		case "InferencePool":
			r.pool = o
		}
	}
	if r.svc == nil {
		t.Fatal("no Service")
	}
	return r
}

// checkEPPService checks what a gateway dials: the Service port that
// reaches turnout's epp.listen, with the appProtocol of its TLS mode, and
// the InferencePool's endpointPickerRef naming that Service and port.
func checkEPPService(p *pod, r eppRender) error {
	var errs []error
	var ext *corev1.ServicePort
	for i := range r.svc.Spec.Ports {
		sp := &r.svc.Spec.Ports[i]
		if sp.Name == "http" {
			errs = append(errs, errors.New("epp: the Service exposes a proxy port (http) no container serves"))
		}
		if sp.Name == "grpc-ext-proc" {
			ext = sp
		}
	}
	if ext == nil {
		return errors.Join(append(errs, errors.New("epp: no grpc-ext-proc Service port"))...)
	}
	tu := container(&p.dep.Spec.Template.Spec, "turnout")
	if n, err := containerPort(tu, ext.TargetPort.String()); err != nil || n != port(p.cfg.EPP.Listen) {
		errs = append(errs, fmt.Errorf("epp: Service port targets %s (%d, %v), turnout's epp.listen is %s", ext.TargetPort.String(), n, err, p.cfg.EPP.Listen))
	}
	want := "http2"
	if p.cfg.EPP.TLS.Mode == config.EPPTLSOff {
		want = "kubernetes.io/h2c"
	}
	if ext.AppProtocol == nil || *ext.AppProtocol != want {
		errs = append(errs, fmt.Errorf("epp: appProtocol %v with tls mode %s, want %s", ext.AppProtocol, p.cfg.EPP.TLS.Mode, want))
	}
	if r.pool != nil {
		name, _, _ := unstructured.NestedString(r.pool.Object, "spec", "endpointPickerRef", "name")
		num, _, _ := unstructured.NestedFieldNoCopy(r.pool.Object, "spec", "endpointPickerRef", "port", "number")
		if name != r.svc.Name || fmt.Sprint(num) != strconv.Itoa(int(ext.Port)) {
			errs = append(errs, fmt.Errorf("epp: InferencePool's endpointPickerRef is %s:%v, turnout's Service %s:%d", name, num, r.svc.Name, ext.Port))
		}
	}
	return errors.Join(errs...)
}

// The epp profile deploys turnout as an InferencePool's Endpoint Picker:
// one container, gRPC probes, the Service and the InferencePool agreeing
// with turnout's config, for each TLS mode and with the operator's own pool.
func TestChartEPPProfile(t *testing.T) {
	helm := kubetest.Helm(t)
	cases := []struct {
		name     string
		set      []string
		tls      string
		pool     bool
		failMode string
	}{
		{"profile", nil, config.EPPTLSSelfSigned, true, "FailClose"},
		{"plaintext, fail open", []string{"epp.tls.mode=off", "epp.inferencePool.failureMode=FailOpen"}, config.EPPTLSOff, true, "FailOpen"},
		{"certificate from a Secret", []string{"epp.tls.mode=files", "epp.tls.secretName=epp-cert"}, config.EPPTLSFiles, true, "FailClose"},
		{"operator's own pool", []string{"epp.inferencePool.create=false"}, config.EPPTLSSelfSigned, false, ""},
	}
	for _, tc := range cases {
		var extra []string
		for _, s := range tc.set {
			extra = append(extra, "--set", s)
		}
		objs := render(t, helm, "epp", "llm", extra...)
		p, err := podOf(objs)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if err := checkPod(p); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
		if err := checkProbes(p); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
		r := eppObjects(t, objs)
		if err := checkEPPService(p, r); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
		if p.cfg.EPP.TLS.Mode != tc.tls {
			t.Errorf("%s: turnout's epp.tls.mode %q, want %q", tc.name, p.cfg.EPP.TLS.Mode, tc.tls)
		}
		if (r.pool != nil) != tc.pool {
			t.Fatalf("%s: InferencePool rendered %v, want %v", tc.name, r.pool != nil, tc.pool)
		}
		if r.pool == nil {
			continue
		}
		fm, _, _ := unstructured.NestedString(r.pool.Object, "spec", "endpointPickerRef", "failureMode")
		labels, _, _ := unstructured.NestedStringMap(r.pool.Object, "spec", "selector", "matchLabels")
		ports, _, _ := unstructured.NestedSlice(r.pool.Object, "spec", "targetPorts")
		if fm != tc.failMode || r.pool.GetName() != "vllm-llama" || labels["app"] != "vllm" || labels["model"] != "llama" || len(ports) != 1 {
			t.Errorf("%s: InferencePool %s: failureMode %q (want %q), matchLabels %v, targetPorts %v", tc.name, r.pool.GetName(), fm, tc.failMode, labels, ports)
		}
	}

	// The checks fail on what a broken epp pod would look like.
	objs := render(t, helm, "epp", "llm")
	p, err := podOf(objs)
	if err != nil {
		t.Fatal(err)
	}
	tu := container(&p.dep.Spec.Template.Spec, "turnout")
	lp := tu.LivenessProbe.GRPC.Port
	tu.LivenessProbe.GRPC.Port = int32(port(p.cfg.EPP.Listen))
	if err := checkProbes(p); err == nil || !strings.Contains(err.Error(), "not epp.health_listen") {
		t.Errorf("a gRPC probe of the TLS listener must fail the check, got %v", err)
	}
	tu.LivenessProbe.GRPC.Port = lp
	r := eppObjects(t, objs)
	r.svc.Spec.Ports[0].AppProtocol = nil
	if err := checkEPPService(p, r); err == nil || !strings.Contains(err.Error(), "appProtocol") {
		t.Errorf("a Service port without appProtocol must fail the check, got %v", err)
	}
	r = eppObjects(t, objs)
	if err := unstructured.SetNestedField(r.pool.Object, int64(9999), "spec", "endpointPickerRef", "port", "number"); err != nil {
		t.Fatal(err)
	}
	if err := checkEPPService(p, r); err == nil || !strings.Contains(err.Error(), "endpointPickerRef") {
		t.Errorf("an endpointPickerRef on another port must fail the check, got %v", err)
	}
	p.cfg.EPP.HealthListen = "127.0.0.1:" + strconv.Itoa(port(p.cfg.EPP.HealthListen))
	if err := checkEPPPod(p); err == nil || !strings.Contains(err.Error(), "grpc-health") {
		t.Errorf("a loopback health listener must fail the check, got %v", err)
	}
}

// values.schema.json and the templates refuse an epp profile that could
// not work, with a message naming the value.
func TestChartEPPRefusesBadValues(t *testing.T) {
	helm := kubetest.Helm(t)
	for _, tc := range []struct {
		set  []string
		want string
	}{
		{[]string{"epp.tls.mode=files"}, "secretName"},
		{[]string{"epp.tls.mode=mtls"}, "mode"},
		{[]string{"epp.inferencePool.failureMode=FailSometimes"}, "failureMode"},
		{[]string{"epp.inferencePool.matchLabels=null"}, "matchLabels"},
		{[]string{"epp.port=80"}, "port"},
	} {
		args := []string{"lint", "--strict", chart, "-f", valuesFile("epp")}
		for _, s := range tc.set {
			args = append(args, "--set", s)
		}
		if _, err := run(t, helm, args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("lint with %v: want a refusal naming %s, got %v", tc.set, tc.want, err)
		}
	}
}
