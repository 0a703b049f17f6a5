// Package kubetest starts a real etcd and kube-apiserver for tests: token
// file authentication, RBAC on, an admin token (system:masters) for the
// test itself and a token for turnout's ServiceAccount, which gets exactly
// the Role and RoleBinding in deploy/kubernetes. Tests skip, with the
// command that provides them, when the binaries are missing.
package kubetest

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/turnout/turnout/lab/testenv/freeport"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Tokens in the token file.
const (
	AdminToken   = "admin-token-for-tests"
	TurnoutToken = "turnout-token-for-tests"
	NobodyToken  = "nobody-token-for-tests" // authenticated, no binding
	// ServiceAccount is turnout's ServiceAccount name in deploy/kubernetes.
	ServiceAccount = "turnout"
)

// Cluster is a running etcd + kube-apiserver.
type Cluster struct {
	t         testing.TB
	Dir       string
	Host      string // https://127.0.0.1:PORT
	CA        []byte
	Namespace string
	Admin     kubernetes.Interface
	etcd      *exec.Cmd
	api       *exec.Cmd
	apiArgs   []string
	apiBin    string
}

// Version is the kube-apiserver version scripts/kube-apiserver.sh builds.
const Version = "v1.31.4"

// APIServerPath is where scripts/kube-apiserver.sh leaves the binary:
// $KUBE_APISERVER, else the cache ($TURNOUT_KUBE_CACHE, else
// $XDG_CACHE_HOME/turnout or ~/.cache/turnout) keyed by Version.
func APIServerPath() string { return cachedBin("KUBE_APISERVER", "kube-apiserver-"+Version) }

// cachedBin is the path in $env, else name in cacheDir.
func cachedBin(env, name string) string {
	if p := os.Getenv(env); p != "" {
		return p
	}
	return filepath.Join(cacheDir(), name)
}

// cacheDir is where scripts/kube-apiserver.sh and scripts/helm.sh cache
// their builds: $TURNOUT_KUBE_CACHE, else $XDG_CACHE_HOME/turnout or
// ~/.cache/turnout.
func cacheDir() string {
	if c := os.Getenv("TURNOUT_KUBE_CACHE"); c != "" {
		return c
	}
	if x := os.Getenv("XDG_CACHE_HOME"); x != "" {
		return filepath.Join(x, "turnout")
	}
	h, _ := os.UserHomeDir()
	return filepath.Join(h, ".cache", "turnout")
}

// RequireEnv turns Skip into a failure: CI sets it, because .ci/run
// provides etcd, kube-apiserver and network namespaces.
const RequireEnv = "TURNOUT_REQUIRE_KUBE"

// Skip skips the test with msg, or fails it when RequireEnv is set.
func Skip(t testing.TB, msg string) {
	t.Helper()
	if os.Getenv(RequireEnv) != "" {
		t.Fatalf("%s (%s is set: the Kubernetes tests must run)", msg, RequireEnv)
	}
	t.Skip(msg)
}

// Binaries returns the etcd and kube-apiserver paths, or skips the test.
func Binaries(t testing.TB) (etcd, apiserver string) {
	t.Helper()
	etcd, err := exec.LookPath("etcd")
	if err != nil {
		Skip(t, "etcd not installed (apt-get install etcd-server; .ci/run does): skipping Kubernetes test")
	}
	apiserver = APIServerPath()
	if _, err := os.Stat(apiserver); err != nil {
		Skip(t, fmt.Sprintf("kube-apiserver not built (%s): run scripts/kube-apiserver.sh (.ci/run does): skipping Kubernetes test", apiserver))
	}
	return etcd, apiserver
}

// Start runs etcd and kube-apiserver in a temp dir, creates namespace ns
// and applies deploy/kubernetes/rbac.yaml (repoRoot) into it. advertise is
// the apiserver's --advertise-address ("" = 127.0.0.1... as the host decides).
func Start(t testing.TB, repoRoot, ns, advertise string) *Cluster {
	t.Helper()
	etcdBin, apiBin := Binaries(t)
	dir := t.TempDir()
	c := &Cluster{t: t, Dir: dir, Namespace: ns, apiBin: apiBin}
	ep, pp := freeport.Port(t), freeport.Port(t)
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(ep)
	c.etcd = start(t, dir, "etcd", etcdBin, "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", "http://127.0.0.1:"+strconv.Itoa(pp), "--initial-advertise-peer-urls", "http://127.0.0.1:"+strconv.Itoa(pp),
		"--initial-cluster", "default=http://127.0.0.1:"+strconv.Itoa(pp), "--log-level", "error")

	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(dir, "sa.key")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		t.Fatal(err)
	}
	tokens := filepath.Join(dir, "tokens.csv")
	sa := "system:serviceaccount:" + ns + ":" + ServiceAccount
	if err := os.WriteFile(tokens, []byte(fmt.Sprintf("%s,admin,admin,\"system:masters\"\n%s,%s,turnout-uid,\"system:serviceaccounts,system:serviceaccounts:%s\"\n%s,nobody,nobody-uid,\n",
		AdminToken, TurnoutToken, sa, ns, NobodyToken)), 0o600); err != nil {
		t.Fatal(err)
	}
	port := freeport.Port(t)
	c.Host = "https://127.0.0.1:" + strconv.Itoa(port)
	certDir := filepath.Join(dir, "certs")
	c.apiArgs = []string{
		"--etcd-servers", etcdURL, "--bind-address", "127.0.0.1", "--secure-port", strconv.Itoa(port),
		"--cert-dir", certDir, "--token-auth-file", tokens, "--authorization-mode", "RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc", "--service-account-key-file", keyFile,
		"--service-account-signing-key-file", keyFile, "--service-cluster-ip-range", "10.96.0.0/16",
		// PodSecurity is on by default; named so the chart tests' restricted
		// namespaces (deploy/chart_test.go) do not depend on that default.
		"--enable-admission-plugins", "PodSecurity",
		"--disable-admission-plugins", "ServiceAccount", "--enable-priority-and-fairness=false",
		"--endpoint-reconciler-type", "none", "--v", "0",
	}
	if advertise != "" {
		c.apiArgs = append(c.apiArgs, "--advertise-address", advertise)
	}
	c.startAPI()
	c.CA, err = os.ReadFile(filepath.Join(certDir, "apiserver.crt"))
	if err != nil {
		t.Fatal(err)
	}
	c.Admin = c.Client(AdminToken)
	c.applyBase(repoRoot)
	return c
}

func start(t testing.TB, dir, name, bin string, args ...string) *exec.Cmd {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { _ = cmd.Wait(); f.Close() }()
	t.Cleanup(func() {
		stop(cmd)
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, name+".log"))
			if len(b) > 8<<10 {
				b = b[len(b)-8<<10:]
			}
			t.Logf("---- %s log ----\n%s", name, b)
		}
	})
	return cmd
}

func stop(cmd *exec.Cmd) {
	if cmd.Process == nil || cmd.ProcessState != nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		for cmd.ProcessState == nil {
			if err := cmd.Process.Signal(syscall.Signal(0)); err != nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
	}
}

// startAPI starts kube-apiserver and waits for /readyz.
func (c *Cluster) startAPI() {
	c.t.Helper()
	c.api = start(c.t, c.Dir, "kube-apiserver", c.apiBin, c.apiArgs...)
	deadline := time.Now().Add(90 * time.Second)
	for {
		if b, err := os.ReadFile(filepath.Join(c.Dir, "certs", "apiserver.crt")); err == nil && len(b) > 0 {
			cs := c.clientWith(AdminToken, b)
			if body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(context.Background()); err == nil && strings.Contains(string(body), "ok") {
				return
			}
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("kube-apiserver not ready within 90s (log: %s)", filepath.Join(c.Dir, "kube-apiserver.log"))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// StopAPI stops the API server (outage tests); StartAPI brings it back on
// the same port and etcd.
func (c *Cluster) StopAPI() { stop(c.api) }

// StartAPI restarts the API server after StopAPI.
func (c *Cluster) StartAPI() { c.startAPI() }

// RESTConfig is a client config for token.
func (c *Cluster) RESTConfig(token string) *rest.Config {
	return &rest.Config{Host: c.Host, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: c.CA}, QPS: 100, Burst: 200}
}

// Client is a clientset authenticating with token.
func (c *Cluster) Client(token string) kubernetes.Interface { return c.clientWith(token, c.CA) }

func (c *Cluster) clientWith(token string, ca []byte) kubernetes.Interface {
	cfg := &rest.Config{Host: c.Host, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: ca}, QPS: 100, Burst: 200, Timeout: 5 * time.Second}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	return cs
}

// Kubeconfig writes a kubeconfig file for token and returns its path.
func (c *Cluster) Kubeconfig(token string) string {
	c.t.Helper()
	p := filepath.Join(c.Dir, "kubeconfig-"+token[:6]+".yaml")
	body := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: test, cluster: {server: %q, certificate-authority: %q}}]
users: [{name: u, user: {token: %q}}]
contexts: [{name: c, context: {cluster: test, user: u, namespace: %q}}]
current-context: c
`, c.Host, filepath.Join(c.Dir, "certs", "apiserver.crt"), token, c.Namespace)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		c.t.Fatal(err)
	}
	return p
}

// applyBase creates the namespace and applies the Role and RoleBinding of
// deploy/kubernetes/rbac.yaml unchanged except for their namespace.
func (c *Cluster) applyBase(repoRoot string) {
	c.t.Helper()
	ctx := context.Background()
	if _, err := c.Admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.Namespace}}, metav1.CreateOptions{}); err != nil {
		c.t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(repoRoot, "deploy", "kubernetes", "rbac.yaml"))
	if err != nil {
		c.t.Fatal(err)
	}
	defer f.Close()
	dec := yaml.NewYAMLOrJSONDecoder(f, 4096)
	for {
		var meta struct {
			Kind string `json:"kind"`
		}
		var raw map[string]any
		if err := dec.Decode(&raw); err != nil {
			break
		}
		b, _ := json.Marshal(raw)
		_ = json.Unmarshal(b, &meta)
		switch meta.Kind {
		case "Role":
			_, err = c.Admin.RbacV1().Roles(c.Namespace).Create(ctx, inNamespace(c, b, &rbacv1.Role{}), metav1.CreateOptions{})
		case "RoleBinding":
			rb := inNamespace(c, b, &rbacv1.RoleBinding{})
			for i := range rb.Subjects {
				rb.Subjects[i].Namespace = c.Namespace
			}
			_, err = c.Admin.RbacV1().RoleBindings(c.Namespace).Create(ctx, rb, metav1.CreateOptions{})
		case "ServiceAccount":
			_, err = c.Admin.CoreV1().ServiceAccounts(c.Namespace).Create(ctx, inNamespace(c, b, &corev1.ServiceAccount{}), metav1.CreateOptions{})
		}
		if err != nil {
			c.t.Fatal(err)
		}
	}
}

// inNamespace decodes b into obj, placed in the test's namespace.
func inNamespace[T metav1.Object](c *Cluster, b []byte, obj T) T {
	if err := json.Unmarshal(b, obj); err != nil {
		c.t.Fatal(err)
	}
	obj.SetNamespace(c.Namespace)
	return obj
}
