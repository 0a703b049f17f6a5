package deploy_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/yaml"

	"github.com/turnout/turnout/control/discovery/kube"
	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/lab/testenv/kubetest"
	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/policy"
)

const chart = "helm/turnout"

// profiles are the values files in helm/turnout/ci the chart is tested with.
var profiles = []string{"haproxy", "nginx", "pd", "monitoring", "inferencepool", "epp"}

func valuesFile(p string) string { return filepath.Join(chart, "ci", p+"-values.yaml") }

func run(t *testing.T, name string, args ...string) ([]byte, error) {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.Bytes(), fmt.Errorf("%s %s: %w: %s%s", filepath.Base(name), strings.Join(args, " "), err, errb.String(), out.String())
	}
	return out.Bytes(), nil
}

// render is `helm template` of the chart for profile into namespace ns.
func render(t *testing.T, helm, profile, ns string, extra ...string) []*unstructured.Unstructured {
	t.Helper()
	out, err := run(t, helm, append([]string{"template", "turnout", chart, "--namespace", ns, "-f", valuesFile(profile)}, extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decode(out)
	if err != nil {
		t.Fatalf("profile %s: %v", profile, err)
	}
	return objs
}

func decode(b []byte) ([]*unstructured.Unstructured, error) {
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	var objs []*unstructured.Unstructured
	for {
		o := &unstructured.Unstructured{}
		if err := dec.Decode(&o.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, fmt.Errorf("decode: %w", err)
		}
		if len(o.Object) > 0 {
			objs = append(objs, o)
		}
	}
}

func TestHelmLint(t *testing.T) {
	helm := kubetest.Helm(t)
	for _, p := range profiles {
		if _, err := run(t, helm, "lint", "--strict", chart, "-f", valuesFile(p)); err != nil {
			t.Errorf("profile %s: %v", p, err)
		}
	}
	// values.schema.json makes lint refuse a bad value.
	if _, err := run(t, helm, "lint", "--strict", chart, "--set", "proxy=envoy"); err == nil || !strings.Contains(err.Error(), "proxy") {
		t.Errorf("lint must refuse proxy=envoy, got %v", err)
	}
}

// The plain manifests are the chart rendered by scripts/manifests.sh.
func TestManifestsRenderedFromChart(t *testing.T) {
	helm := kubetest.Helm(t)
	dir := t.TempDir()
	cmd := exec.Command("bash", "../scripts/manifests.sh", dir)
	cmd.Env = append(os.Environ(), "HELM="+helm)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("scripts/manifests.sh: %v: %s", err, out)
	}
	want, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	have, _ := filepath.Glob(filepath.Join("kubernetes", "*.yaml"))
	if len(want) == 0 {
		t.Fatal("scripts/manifests.sh rendered nothing")
	}
	var names []string
	for _, f := range want {
		names = append(names, filepath.Base(f))
		r, _ := os.ReadFile(f)
		c, err := os.ReadFile(filepath.Join("kubernetes", filepath.Base(f)))
		if err != nil || !bytes.Equal(r, c) {
			t.Errorf("deploy/kubernetes/%s differs from the chart's rendering: run make manifests", filepath.Base(f))
		}
	}
	for _, f := range have {
		if !slices.Contains(names, filepath.Base(f)) {
			t.Errorf("deploy/kubernetes/%s is not rendered from the chart (scripts/manifests.sh)", filepath.Base(f))
		}
	}
}

// pod is a rendered chart's pieces: its Deployment and turnout's config.
type pod struct {
	dep *appsv1.Deployment
	cfg *config.Config
}

func podOf(objs []*unstructured.Unstructured) (*pod, error) {
	p := &pod{}
	for _, o := range objs {
		switch o.GetKind() {
		case "Deployment":
			p.dep = &appsv1.Deployment{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, p.dep); err != nil {
				return nil, fmt.Errorf("deployment: %w", err)
			}
		case "ConfigMap":
			data, _, _ := unstructured.NestedStringMap(o.Object, "data")
			if y, ok := data["turnout.yaml"]; ok {
				cfg, err := config.ParseConfig([]byte(y))
				if err != nil {
					return nil, fmt.Errorf("turnout.yaml: %w", err)
				}
				p.cfg = cfg
			}
		}
	}
	if p.dep == nil || p.cfg == nil {
		return nil, errors.New("no Deployment or no ConfigMap with turnout.yaml")
	}
	return p, nil
}

func container(spec *corev1.PodSpec, name string) *corev1.Container {
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i]
		}
	}
	return nil
}

func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func port(addr string) int {
	_, p, _ := net.SplitHostPort(addr)
	n, _ := strconv.Atoi(p)
	return n
}

// containerPort resolves a probe's port (name or number) in c.
func containerPort(c *corev1.Container, p string) (int, error) {
	for _, cp := range c.Ports {
		if cp.Name == p || strconv.Itoa(int(cp.ContainerPort)) == p {
			return int(cp.ContainerPort), nil
		}
	}
	return 0, fmt.Errorf("container %s: probe port %q is not one of its ports", c.Name, p)
}

// checkProbes fails a probe the kubelet cannot reach: one that sets host
// (the kubelet would probe its node, not the pod), or whose port is a
// listener turnout (or the proxy) binds to loopback only.
func checkProbes(p *pod) error {
	// Which listener each pod port is, and whether it is loopback-only.
	type lsn struct {
		field string
		loop  bool
	}
	byPort := map[int]lsn{}
	add := func(field, addr string) {
		if addr != "" {
			byPort[port(addr)] = lsn{field, loopback(addr)}
		}
	}
	add("listen", p.cfg.Listen)
	add("feedback.syslog", p.cfg.Feedback.Syslog)
	add("admin_listen", p.cfg.AdminListen)
	add("epp.listen", p.cfg.EPP.Listen)
	add("epp.health_listen", p.cfg.EPP.HealthListen)
	if container(&p.dep.Spec.Template.Spec, "nginx") != nil {
		add("nginx.listen", p.cfg.Nginx.Listen)
	} else {
		add("haproxy.listen", p.cfg.HAProxy.Listen)
	}
	var errs []error
	n := 0
	for i := range p.dep.Spec.Template.Spec.Containers {
		c := &p.dep.Spec.Template.Spec.Containers[i]
		for kind, pr := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe, "startup": c.StartupProbe} {
			if pr == nil {
				continue
			}
			n++
			var host string
			var pp string
			switch {
			case pr.HTTPGet != nil:
				host, pp = pr.HTTPGet.Host, pr.HTTPGet.Port.String()
			case pr.TCPSocket != nil:
				host, pp = pr.TCPSocket.Host, pr.TCPSocket.Port.String()
			case pr.GRPC != nil:
				pp = strconv.Itoa(int(pr.GRPC.Port))
			default:
				continue
			}
			if host != "" {
				errs = append(errs, fmt.Errorf("%s %s probe sets host %q: the kubelet would probe that address from the node, not the pod", c.Name, kind, host))
			}
			num, err := containerPort(c, pp)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			l, ok := byPort[num]
			switch {
			case !ok:
				errs = append(errs, fmt.Errorf("%s %s probe: port %d is no listener of turnout's config", c.Name, kind, num))
			case l.loop:
				errs = append(errs, fmt.Errorf("%s %s probe: port %d is %s, bound to loopback: the kubelet cannot reach it", c.Name, kind, num, l.field))
			case c.Name == "turnout" && pr.GRPC == nil && l.field != "admin_listen":
				errs = append(errs, fmt.Errorf("turnout %s probe: port %d is %s, not admin_listen", kind, num, l.field))
			case c.Name == "turnout" && pr.GRPC != nil && (l.field != "epp.health_listen" || p.cfg.EPP.HealthListen == p.cfg.EPP.Listen):
				// The kubelet's gRPC probe speaks no TLS: only the plaintext health listener answers it.
				errs = append(errs, fmt.Errorf("turnout %s gRPC probe: port %d is %s, not epp.health_listen", kind, num, l.field))
			}
		}
	}
	if n == 0 {
		errs = append(errs, errors.New("no probes at all"))
	}
	return errors.Join(errs...)
}

// checkPod checks that the rendered pod would start: a config turnout
// accepts, one directory shared by turnout and the proxy, which runs the
// file turnout renders there.
func checkPod(p *pod) error {
	if err := kube.Check(p.cfg); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	srv, err := route.New(p.cfg, route.Options{Registry: policy.DefaultRegistry()})
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	srv.Close()
	spec := &p.dep.Spec.Template.Spec
	tu := container(spec, "turnout")
	if tu == nil {
		return errors.New("no turnout container")
	}
	proxy, flag, file := container(spec, "haproxy"), "--haproxy-dir=", "haproxy.cfg"
	if proxy == nil {
		proxy, flag, file = container(spec, "nginx"), "--nginx-dir=", "nginx.conf"
	}
	if p.cfg.EPP.On() {
		if proxy != nil {
			return fmt.Errorf("epp: the gateway is the proxy, yet the pod runs %s", proxy.Name)
		}
		return checkEPPPod(p)
	}
	if proxy == nil {
		return errors.New("no proxy container")
	}
	var dir string
	for _, a := range tu.Args {
		if v, ok := strings.CutPrefix(a, flag); ok {
			dir = v
		}
	}
	if dir == "" {
		return fmt.Errorf("turnout has no %s", flag)
	}
	mount := func(c *corev1.Container) string {
		for _, m := range c.VolumeMounts {
			if m.MountPath == dir {
				return m.Name
			}
		}
		return ""
	}
	if v := mount(tu); v == "" || v != mount(proxy) {
		return fmt.Errorf("%s: turnout mounts %q, %s %q: want one shared volume", dir, v, proxy.Name, mount(proxy))
	}
	if !strings.Contains(strings.Join(append(proxy.Command, proxy.Args...), " "), filepath.Join(dir, file)) {
		return fmt.Errorf("%s does not run %s", proxy.Name, filepath.Join(dir, file))
	}
	if g := spec.TerminationGracePeriodSeconds; g == nil || float64(*g) <= p.cfg.HAProxy.DrainTimeout.D().Seconds() {
		return fmt.Errorf("terminationGracePeriodSeconds must exceed haproxy.drain_timeout (%s)", p.cfg.HAProxy.DrainTimeout.D())
	}
	for _, c := range spec.Containers {
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
			return fmt.Errorf("container %s: cpu and memory requests and a memory limit are required", c.Name)
		}
	}
	return nil
}

func TestChartPods(t *testing.T) {
	helm := kubetest.Helm(t)
	for _, prof := range profiles {
		p, err := podOf(render(t, helm, prof, "llm"))
		if err != nil {
			t.Fatalf("profile %s: %v", prof, err)
		}
		if err := checkProbes(p); err != nil {
			t.Errorf("profile %s: %v", prof, err)
		}
		if err := checkPod(p); err != nil {
			t.Errorf("profile %s: %v", prof, err)
		}
		if prof == "nginx" {
			if g := p.cfg.Deployments[1].Pools[0].Discovery.Kubernetes.Grace(); g != 30*time.Second {
				t.Errorf("profile nginx: vanish_grace %v in turnout's config, want the values' 30s", g)
			}
		}
	}
	// The probe check fails on what the issue found in the old manifests.
	p, err := podOf(render(t, helm, "haproxy", "llm"))
	if err != nil {
		t.Fatal(err)
	}
	tu := container(&p.dep.Spec.Template.Spec, "turnout")
	tu.ReadinessProbe.HTTPGet.Host = "127.0.0.1"
	if err := checkProbes(p); err == nil || !strings.Contains(err.Error(), "sets host") {
		t.Errorf("a probe with host: must fail the check, got %v", err)
	}
	tu.ReadinessProbe.HTTPGet.Host = ""
	p.cfg.AdminListen = "127.0.0.1:" + strconv.Itoa(port(p.cfg.AdminListen))
	if err := checkProbes(p); err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Errorf("a probe of a loopback admin_listen must fail the check, got %v", err)
	}
}

// restricted labels a namespace to enforce (and warn about) the restricted
// Pod Security Standard.
var restricted = map[string]string{
	"pod-security.kubernetes.io/enforce": "restricted",
	"pod-security.kubernetes.io/warn":    "restricted",
	"pod-security.kubernetes.io/audit":   "restricted",
}

// Every rendered object of every profile is accepted by a real API server
// (server-side dry run, strict field validation) in a namespace enforcing
// restricted Pod Security, with no warning; the pod of each Deployment is
// admitted there too (PodSecurity enforces on pods, only warns on
// Deployments).
func TestChartAcceptedRestricted(t *testing.T) {
	helm := kubetest.Helm(t)
	c := kubetest.Start(t, "..", "llm", "")
	ctx := context.Background()
	install, err := kubetest.NewApplier(c, false)
	if err != nil {
		t.Fatal(err)
	}
	crds, _ := filepath.Glob("testdata/crds/*.yaml")
	for _, f := range crds {
		b, _ := os.ReadFile(f)
		if _, err := install.Apply(ctx, bytes.NewReader(b)); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	dry, err := kubetest.NewApplier(c, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, prof := range profiles {
		ns := "psa-" + prof
		if _, err := c.Admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: restricted}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		objs := render(t, helm, prof, ns)
		var kinds []string
		for _, o := range objs {
			// CRDs just created may take a moment to be served.
			var err error
			for deadline := time.Now().Add(20 * time.Second); ; {
				dry.Reset()
				if err = dry.ApplyObject(ctx, o); err == nil || !strings.Contains(err.Error(), "no matches for kind") || time.Now().After(deadline) {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			if err != nil {
				t.Errorf("profile %s: rejected: %v", prof, err)
				continue
			}
			kinds = append(kinds, o.GetKind())
		}
		if w := dry.TakeWarnings(); len(w) > 0 {
			t.Errorf("profile %s: API server warnings: %q", prof, w)
		}
		want := []string{"ConfigMap", "Deployment", "Service", "ServiceAccount", "PodDisruptionBudget"}
		if prof != "epp" && prof != "monitoring" { // monitoring names an existing token Secret
			want = append(want, "Secret")
		}
		if prof == "monitoring" {
			want = append(want, "ClusterRole", "ClusterRoleBinding", "ServiceMonitor", "PrometheusRule", "NetworkPolicy")
		} else {
			if prof == "epp" {
				want = append(want, "InferencePool")
			}
			want = append(want, "Role", "RoleBinding")
		}
		for _, k := range want {
			if !slices.Contains(kinds, k) {
				t.Errorf("profile %s: no %s accepted (have %v)", prof, k, kinds)
			}
		}
		p, err := podOf(objs)
		if err != nil {
			t.Fatal(err)
		}
		if err := dry.ApplyObject(ctx, podObject(t, p.dep, ns)); err != nil {
			t.Errorf("profile %s: the Deployment's pod is refused: %v", prof, err)
		}
	}
	// The namespace really enforces: a pod without the securityContexts is refused.
	p, err := podOf(render(t, helm, "haproxy", "psa-haproxy"))
	if err != nil {
		t.Fatal(err)
	}
	p.dep.Spec.Template.Spec.SecurityContext = nil
	for i := range p.dep.Spec.Template.Spec.Containers {
		p.dep.Spec.Template.Spec.Containers[i].SecurityContext = nil
	}
	if err := dry.ApplyObject(ctx, podObject(t, p.dep, "psa-haproxy")); err == nil || !strings.Contains(err.Error(), "PodSecurity") {
		t.Errorf("a pod without securityContext must be refused by PodSecurity, got %v", err)
	}
	t.Run("feedback token Secret", func(t *testing.T) { checkFeedbackSecret(t, c, helm, install, dry) })
}

// checkFeedbackSecret: the token Secret the chart makes is created on the
// API server and an upgrade's render (lookup, helm template
// --dry-run=server) keeps its token; the pod that mounts it (read-only,
// group-readable by the pod's user 65532, beside the read-only config) is
// admitted under restricted Pod Security, and turnout's token_file is the
// mounted key.
func checkFeedbackSecret(t *testing.T, c *kubetest.Cluster, helm string, install, dry *kubetest.Applier) {
	ctx := context.Background()
	const ns = "psa-haproxy"
	kubeconfig := c.Kubeconfig(kubetest.AdminToken)
	token := func(objs []*unstructured.Unstructured) string {
		for _, o := range objs {
			if o.GetKind() == "Secret" {
				tok, _, _ := unstructured.NestedString(o.Object, "data", "token")
				return tok
			}
		}
		t.Fatal("no Secret rendered")
		return ""
	}
	first := render(t, helm, "haproxy", ns, "--dry-run=server", "--kubeconfig", kubeconfig)
	for _, o := range first {
		if o.GetKind() == "Secret" {
			if err := install.ApplyObject(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
	}
	if a, b := token(first), token(render(t, helm, "haproxy", ns, "--dry-run=server", "--kubeconfig", kubeconfig)); a == "" || a != b {
		t.Errorf("an upgrade's render must keep the Secret's token: %q then %q", a, b)
	}
	if a, b := token(first), token(render(t, helm, "haproxy", "psa-nginx", "--dry-run=server", "--kubeconfig", kubeconfig)); a == b {
		t.Error("a release without a Secret yet must get a new random token")
	}
	p, err := podOf(first)
	if err != nil {
		t.Fatal(err)
	}
	spec := &p.dep.Spec.Template.Spec
	if sc := spec.SecurityContext; sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 65532 || sc.FSGroup == nil || *sc.FSGroup != 65532 {
		t.Fatalf("the pod must run as 65532 with fsGroup 65532: %+v", sc)
	}
	var vol *corev1.Volume
	for i := range spec.Volumes {
		if s := spec.Volumes[i].Secret; s != nil && s.SecretName == "turnout-feedback" {
			vol = &spec.Volumes[i]
		}
	}
	if vol == nil || vol.Secret.DefaultMode == nil || *vol.Secret.DefaultMode&0o040 == 0 || *vol.Secret.DefaultMode&0o007 != 0 {
		t.Fatalf("the token Secret's volume must be group-readable (fsGroup) and not world-readable: %+v", vol)
	}
	tu := container(spec, "turnout")
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range tu.VolumeMounts {
		mounts[m.Name] = m
	}
	tm, cm := mounts[vol.Name], mounts["config"]
	if !tm.ReadOnly || !cm.ReadOnly {
		t.Errorf("turnout must mount the token Secret (%+v) and the config (%+v) read-only", tm, cm)
	}
	if want := filepath.Join(tm.MountPath, vol.Secret.Items[0].Path); p.cfg.Feedback.TokenFile != want {
		t.Errorf("feedback.token_file %q, the Secret's key is mounted at %q", p.cfg.Feedback.TokenFile, want)
	}
	for _, c := range spec.Containers {
		if c.Name != "turnout" {
			for _, m := range c.VolumeMounts {
				if m.Name == vol.Name {
					t.Errorf("container %s mounts the token Secret: only turnout needs it", c.Name)
				}
			}
		}
	}
	if err := dry.ApplyObject(ctx, podObject(t, p.dep, ns)); err != nil {
		t.Errorf("the pod mounting the token Secret is refused: %v", err)
	}
}

// podObject is the pod a Deployment's ReplicaSet would create.
func podObject(t *testing.T, dep *appsv1.Deployment, ns string) *unstructured.Unstructured {
	t.Helper()
	pod := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: dep.Name + "-pod", Namespace: ns, Labels: dep.Spec.Template.Labels},
		Spec:       dep.Spec.Template.Spec,
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(pod)
	if err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: m}
}

// The values example of docs/kubernetes.md renders a pod that would start.
func TestDocsValuesExample(t *testing.T) {
	helm := kubetest.Helm(t)
	b, err := os.ReadFile("../docs/kubernetes.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "```yaml\n# my-values.yaml\n")
	values, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("docs/kubernetes.md has no my-values.yaml example")
	}
	f := filepath.Join(t.TempDir(), "my-values.yaml")
	if err := os.WriteFile(f, []byte(values), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, helm, "template", "turnout", chart, "--namespace", "llm", "-f", f)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decode(out)
	if err != nil {
		t.Fatal(err)
	}
	p, err := podOf(objs)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkPod(p); err != nil {
		t.Error(err)
	}
	if err := checkProbes(p); err != nil {
		t.Error(err)
	}
	if len(p.cfg.Deployments) != 2 || p.cfg.Deployments[0].Pools[0].Discovery.Kubernetes.RoleLabel == "" {
		t.Errorf("the example must show prefill/decode pools sorted by role_label, got %+v", p.cfg.Deployments)
	}
}
