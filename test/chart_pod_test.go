//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	sigyaml "sigs.k8s.io/yaml"

	"github.com/turnout/turnout/lab/mock"
	"github.com/turnout/turnout/lab/testenv/kubetest"
)

// podUID is the user every container of the chart's pod runs as.
const podUID = 65532

// TestChartPodStarts runs the pod the Helm chart renders, without a
// kubelet: each container's own command and arguments, as the pod's
// non-root user, on the chart's config. Only what a cluster provides is
// swapped: the directories (volumes) move to a temp dir owned by that user
// (the config and the feedback token Secret read-only, as the kubelet
// mounts them), ports to free ones, and the discovered pool becomes two
// mock replicas. The probes' paths must answer on the admin listener, a
// chat request must go through the proxy, for HAProxy and for nginx, and
// the proxy's rendered config carries the Secret's token at mode 0600.
func TestChartPodStarts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run the pod's containers as its user")
	}
	helm := kubetest.Helm(t)
	for _, proxy := range []string{"haproxy", "nginx"} {
		t.Run(proxy, func(t *testing.T) {
			if proxy == "haproxy" {
				NeedHAProxy(t)
			} else if _, err := exec.LookPath("nginx"); err != nil {
				t.Skip("nginx not installed")
			}
			runChartPod(t, helm, proxy)
		})
	}
}

func runChartPod(t *testing.T, helm, proxy string) {
	chart := filepath.Join(repoRoot(), "deploy", "helm", "turnout")
	out, err := exec.Command(helm, "template", "turnout", chart, "-f", filepath.Join(chart, "ci", proxy+"-values.yaml"),
		"--show-only", "templates/configmap.yaml", "--show-only", "templates/deployment.yaml").Output()
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	var cm corev1.ConfigMap
	var dep appsv1.Deployment
	docs := strings.Split(string(out), "\n---\n")
	for _, d := range docs {
		switch {
		case strings.Contains(d, "\nkind: ConfigMap"):
			if err := sigyaml.Unmarshal([]byte(d), &cm); err != nil {
				t.Fatal(err)
			}
		case strings.Contains(d, "\nkind: Deployment"):
			if err := sigyaml.Unmarshal([]byte(d), &dep); err != nil {
				t.Fatal(err)
			}
		}
	}
	spec := dep.Spec.Template.Spec
	if len(spec.Containers) != 2 || cm.Data["turnout.yaml"] == "" {
		t.Fatalf("rendered pod: %d containers, config %q", len(spec.Containers), cm.Data["turnout.yaml"])
	}
	if spec.SecurityContext == nil || spec.SecurityContext.RunAsUser == nil || *spec.SecurityContext.RunAsUser != podUID {
		t.Fatalf("the pod must run as %d", podUID)
	}

	// Volumes -> directories owned by the pod's user (fsGroup's effect).
	work, err := os.MkdirTemp("", "turnout-chart-pod-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(work) })
	paths := map[string]string{}
	for _, c := range spec.Containers {
		for _, m := range c.VolumeMounts {
			if _, ok := paths[m.MountPath]; !ok {
				paths[m.MountPath] = filepath.Join(work, m.Name)
			}
		}
	}
	for _, d := range append([]string{work}, valuesOf(paths)...) {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(d, podUID, podUID); err != nil {
			t.Fatal(err)
		}
	}
	// One pass, longest mount path first: a rewritten path is not rewritten again.
	froms := make([]string, 0, len(paths))
	for from := range paths {
		froms = append(froms, from)
	}
	sort.Slice(froms, func(i, j int) bool { return len(froms[i]) > len(froms[j]) })
	var pairs []string
	for _, from := range froms {
		pairs = append(pairs, from, paths[from])
	}
	rewrite := strings.NewReplacer(pairs...).Replace

	// The chart's config with cluster-provided parts swapped.
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(cm.Data["turnout.yaml"]), &cfg); err != nil {
		t.Fatal(err)
	}
	mocks := []*Mock{}
	deps := cfg["deployments"].([]any)
	model := deps[0].(map[string]any)["models"].([]any)[0].(string)
	for _, d := range deps {
		for _, p := range d.(map[string]any)["pools"].([]any) {
			pool := p.(map[string]any)
			delete(pool, "discovery")
			var eps []any
			for i := 0; i < 2; i++ {
				models := []string{}
				for _, m := range d.(map[string]any)["models"].([]any) {
					models = append(models, m.(string))
				}
				m := StartMock(t, fmt.Sprintf("%s-%d", d.(map[string]any)["name"], i), func(c *mock.Config) { c.Models = models })
				mocks = append(mocks, m)
				eps = append(eps, map[string]any{"name": m.Name, "address": m.Addr})
			}
			pool["endpoints"] = eps
		}
	}
	adminPort, proxyPort := FreePort(t), FreePort(t)
	cfg["listen"] = FreeAddr(t)
	cfg["admin_listen"] = swapPort(t, cfg["admin_listen"].(string), adminPort)
	tokenFile := rewrite(cfg["feedback"].(map[string]any)["token_file"].(string))
	cfg["feedback"] = map[string]any{"syslog": FreeAddr(t), "token_file": tokenFile}
	px := cfg[proxy].(map[string]any)
	px["listen"] = swapPort(t, px["listen"].(string), proxyPort)
	px["dir"] = rewrite(px["dir"].(string))
	b, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfgDir := paths["/etc/turnout"]
	if err := os.WriteFile(filepath.Join(cfgDir, "turnout.yaml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	// The read-only mounts: the config (a ConfigMap) and the token (a
	// Secret: root's, group fsGroup, the chart's defaultMode).
	const token = "chart-pod-token-0123456789"
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o440); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{cfgDir, filepath.Dir(tokenFile)} {
		if err := os.Chown(d, 0, podUID); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o555); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(tokenFile, 0, podUID); err != nil {
		t.Fatal(err)
	}

	// The turnout image's entrypoint is the binary; copy it where the user can run it.
	bin := filepath.Join(work, "turnout")
	src, err := os.ReadFile(TurnoutBin(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, src, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range spec.Containers {
		c := c
		var cmd *exec.Cmd
		if c.Name == "turnout" {
			args := make([]string, len(c.Args))
			for i, a := range c.Args {
				args[i] = rewrite(a)
			}
			cmd = exec.Command(bin, args...)
		} else {
			argv := append(append([]string(nil), c.Command...), c.Args...)
			for i := range argv {
				argv[i] = rewrite(argv[i])
			}
			cmd = exec.Command(argv[0], argv[1:]...)
		}
		cmd.Dir = work
		cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "POD_NAMESPACE=llm"}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: podUID, Gid: podUID}}
		StartCmd(t, c.Name, cmd)
	}

	// The kubelet's view: the probes of the turnout container, on the admin port.
	tu := container(spec, "turnout")
	admin := fmt.Sprintf("http://127.0.0.1:%d", adminPort)
	for _, pr := range []*corev1.Probe{tu.LivenessProbe, tu.ReadinessProbe} {
		if pr == nil || pr.HTTPGet == nil || pr.HTTPGet.Host != "" {
			t.Fatalf("turnout probe %+v: want an httpGet without host", pr)
		}
		u := admin + pr.HTTPGet.Path
		Eventually(t, 20*time.Second, "probe "+u, func() bool {
			r, err := http.Get(u)
			if err != nil {
				return false
			}
			r.Body.Close()
			return r.StatusCode == http.StatusOK
		})
	}
	// A client's request through the proxy container.
	front := fmt.Sprintf("http://127.0.0.1:%d", proxyPort)
	body := fmt.Sprintf(`{"model":%q,"max_tokens":4,"messages":[{"role":"user","content":"hello"}]}`, model)
	var last string
	Eventually(t, 20*time.Second, "a chat completion through "+proxy, func() bool {
		r, err := Post(context.Background(), &http.Client{Timeout: 5 * time.Second}, front+"/v1/chat/completions", []byte(body), nil)
		if err != nil {
			last = err.Error()
			return false
		}
		last = fmt.Sprintf("%d %s", r.Status, r.Body)
		return r.Status == http.StatusOK && r.Header.Get("X-Replica") != ""
	})
	t.Logf("%s: %s", proxy, strings.TrimSpace(last)[:min(len(strings.TrimSpace(last)), 120)])

	// The rendered proxy config holds the Secret's token, readable by its owner only.
	rendered := filepath.Join(px["dir"].(string), map[string]string{"haproxy": "haproxy.cfg", "nginx": "nginx.conf"}[proxy])
	fi, err := os.Stat(rendered)
	if err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(rendered); !strings.Contains(string(data), "tok="+token) || fi.Mode().Perm() != 0o600 {
		t.Errorf("%s: mode %v, holds the Secret's token: %v; want 0600 and the token", rendered, fi.Mode().Perm(), strings.Contains(string(data), "tok="+token))
	}
	if es, _ := os.ReadDir(cfgDir); len(es) != 1 {
		t.Errorf("the read-only config directory holds %d files, want turnout.yaml alone", len(es))
	}
}

func container(spec corev1.PodSpec, name string) *corev1.Container {
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i]
		}
	}
	return nil
}

func valuesOf(m map[string]string) []string {
	var out []string
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// swapPort keeps addr's host (the chart's choice of interface) on a free port.
func swapPort(t *testing.T, addr string, port int) string {
	t.Helper()
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("%q: %v", addr, err)
	}
	return net.JoinHostPort(host, fmt.Sprint(port))
}
