package kubetest_test

import (
	"bytes"
	"context"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/turnout/turnout/internal/config"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/turnout/turnout/control/discovery/kube"
	"github.com/turnout/turnout/lab/testenv/kubetest"
	"github.com/turnout/turnout/route/contract"
)

const repoRoot = "../../.."

// TestDeployManifestsAccepted applies every file in deploy/kubernetes to a
// real API server (server-side apply, strict field validation) and checks
// that the pieces fit: the ConfigMap's config is a valid turnout config with
// Kubernetes pools, the Deployment reads it where it is mounted, runs as the
// ServiceAccount that rbac.yaml binds, shares the HAProxy directory between
// both containers, and the Service reaches HAProxy's listen port.
func TestDeployManifestsAccepted(t *testing.T) {
	c := kubetest.Start(t, repoRoot, "llm", "")
	ctx := context.Background()
	a, err := kubetest.NewApplier(c, false)
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(repoRoot, "deploy", "kubernetes", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	var applied []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		got, err := a.Apply(ctx, bytes.NewReader(b))
		if err != nil {
			t.Fatalf("%s rejected by the API server: %v", filepath.Base(f), err)
		}
		applied = append(applied, got...)
	}
	for _, want := range []string{"ServiceAccount/turnout", "Role/turnout-discovery", "RoleBinding/turnout-discovery",
		"ConfigMap/turnout", "Deployment/turnout", "Service/turnout"} {
		if !slices.Contains(applied, want) {
			t.Errorf("%s missing from deploy/kubernetes (applied %v)", want, applied)
		}
	}

	// The strict validation above is real: a misplaced field is refused.
	bad := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x","namespace":"llm"},"dta":{}}`
	if _, err := a.Apply(ctx, strings.NewReader(bad)); err == nil || !strings.Contains(err.Error(), "dta") {
		t.Fatalf("an unknown field must be rejected, got %v", err)
	}

	cs := c.Admin
	dep, err := cs.AppsV1().Deployments("llm").Get(ctx, "turnout", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm, err := cs.CoreV1().ConfigMaps("llm").Get(ctx, "turnout", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := cs.CoreV1().Services("llm").Get(ctx, "turnout", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	spec := dep.Spec.Template.Spec
	if _, err := cs.CoreV1().ServiceAccounts("llm").Get(ctx, spec.ServiceAccountName, metav1.GetOptions{}); err != nil {
		t.Errorf("serviceAccountName %q: %v", spec.ServiceAccountName, err)
	}
	if spec.ServiceAccountName != kubetest.ServiceAccount {
		t.Errorf("serviceAccountName %q, rbac.yaml binds %q", spec.ServiceAccountName, kubetest.ServiceAccount)
	}
	if spec.ShareProcessNamespace == nil || !*spec.ShareProcessNamespace {
		t.Error("shareProcessNamespace must be true: turnout reloads HAProxy with SIGUSR2 to its master")
	}
	tu, ha := container(t, spec, "turnout"), container(t, spec, "haproxy")

	// The config file turnout reads comes from the ConfigMap.
	cfgPath := flagValue(tu.Args, "--config")
	cmVol := mountedVolume(t, spec, tu, cfgPath)
	if cmVol.ConfigMap == nil || cmVol.ConfigMap.Name != cm.Name {
		t.Fatalf("--config %s is not on the turnout ConfigMap's volume", cfgPath)
	}
	yml, ok := cm.Data[filepath.Base(cfgPath)]
	if !ok {
		t.Fatalf("ConfigMap has no key %s", filepath.Base(cfgPath))
	}
	cfg, err := config.ParseConfig([]byte(yml))
	if err != nil {
		t.Fatalf("ConfigMap config: %v", err)
	}
	if err := kube.Check(cfg); err != nil {
		t.Fatalf("ConfigMap config: %v", err)
	}
	if !cfg.HasDiscovery() {
		t.Error("the sample config has no Kubernetes pools")
	}
	roles := map[string]bool{}
	for _, d := range cfg.Deployments {
		for _, p := range d.Pools {
			if p.Discovery != nil && p.Discovery.Kubernetes != nil && p.Discovery.Kubernetes.RoleLabel != "" {
				roles[p.Role] = true
			}
		}
	}
	if !roles["prefill"] || !roles["decode"] {
		t.Errorf("the sample must show prefill and decode pools split by a role label, has %v", roles)
	}

	// One HAProxy directory, shared by both containers.
	dir := flagValue(tu.Args, "--haproxy-dir")
	if dir == "" || dir != cfg.HAProxy.Dir {
		t.Errorf("--haproxy-dir %q and haproxy.dir %q differ", dir, cfg.HAProxy.Dir)
	}
	v1, v2 := mountedVolume(t, spec, tu, dir), mountedVolume(t, spec, ha, dir)
	if v1.Name != v2.Name || v1.EmptyDir == nil {
		t.Errorf("%s: turnout mounts volume %q, haproxy %q; want one shared emptyDir", dir, v1.Name, v2.Name)
	}
	if !strings.Contains(strings.Join(append(ha.Command, ha.Args...), " "), filepath.Join(dir, "haproxy.cfg")) {
		t.Errorf("haproxy does not run %s: %v %v", filepath.Join(dir, "haproxy.cfg"), ha.Command, ha.Args)
	}

	// The Service reaches HAProxy's listen port.
	_, hport, _ := net.SplitHostPort(cfg.HAProxy.Listen)
	if len(svc.Spec.Ports) == 0 || port(ha, svc.Spec.Ports[0].TargetPort.String()) != hport {
		t.Errorf("Service targets %v, HAProxy listens on %s", svc.Spec.Ports, cfg.HAProxy.Listen)
	}
	// Probes reach the admin listener (the route API stays on loopback);
	// deploy/chart_test.go checks every probe of every chart profile.
	_, aport, _ := net.SplitHostPort(cfg.AdminListen)
	if tu.ReadinessProbe == nil || tu.ReadinessProbe.HTTPGet == nil || tu.ReadinessProbe.HTTPGet.Path != contract.PathReadyz ||
		tu.ReadinessProbe.HTTPGet.Host != "" || aport == "" || port(tu, tu.ReadinessProbe.HTTPGet.Port.String()) != aport {
		t.Errorf("turnout readiness probe must GET %s on admin_listen %q, without host", contract.PathReadyz, cfg.AdminListen)
	}
	if !maps.Equal(svc.Spec.Selector, dep.Spec.Selector.MatchLabels) {
		t.Errorf("Service selector %v, Deployment %v", svc.Spec.Selector, dep.Spec.Selector.MatchLabels)
	}
	if g := dep.Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || float64(*g) <= cfg.HAProxy.DrainTimeout.D().Seconds() {
		t.Errorf("terminationGracePeriodSeconds must exceed haproxy.drain_timeout (%s)", cfg.HAProxy.DrainTimeout.D())
	}
}

func container(t *testing.T, spec corev1.PodSpec, name string) *corev1.Container {
	t.Helper()
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i]
		}
	}
	t.Fatalf("no container %q", name)
	return nil
}

// flagValue returns the value after flag in args.
func flagValue(args []string, flag string) string {
	for i := range args {
		if args[i] == flag && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(args[i], flag+"="); ok {
			return v
		}
	}
	return ""
}

// mountedVolume returns the pod volume c mounts at (a parent of) path.
func mountedVolume(t *testing.T, spec corev1.PodSpec, c *corev1.Container, path string) corev1.Volume {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if path == m.MountPath || strings.HasPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/") {
			for _, v := range spec.Volumes {
				if v.Name == m.Name {
					return v
				}
			}
			t.Fatalf("container %s mounts unknown volume %q", c.Name, m.Name)
		}
	}
	t.Fatalf("container %s mounts nothing at %s", c.Name, path)
	return corev1.Volume{}
}

// port resolves a port name or number of container c to its number.
func port(c *corev1.Container, p string) string {
	if _, err := strconv.Atoi(p); err == nil {
		return p
	}
	for _, cp := range c.Ports {
		if cp.Name == p {
			return strconv.Itoa(int(cp.ContainerPort))
		}
	}
	return ""
}
