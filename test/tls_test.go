//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/turnout/turnout/nginx"
)

// tlsFiles are a CA and a server certificate for 127.0.0.1 made with
// openssl, as an operator would.
type tlsFiles struct{ CA, Cert, Key string }

func makeCerts(t *testing.T) tlsFiles {
	t.Helper()
	openssl, err := exec.LookPath("openssl")
	if err != nil {
		t.Skip("openssl is not installed: skipping the TLS test")
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f := tlsFiles{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "server.pem"), Key: filepath.Join(dir, "server.pem.key")}
	ext := filepath.Join(dir, "san.ext")
	if err := os.WriteFile(ext, []byte("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", filepath.Join(dir, "ca.key"), "-out", f.CA, "-days", "2", "-subj", "/CN=turnout e2e CA"},
		{"req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f.Key, "-out", filepath.Join(dir, "server.csr"), "-subj", "/CN=localhost"},
		{"x509", "-req", "-in", filepath.Join(dir, "server.csr"), "-CA", f.CA, "-CAkey", filepath.Join(dir, "ca.key"), "-CAcreateserial", "-out", f.Cert, "-days", "2", "-extfile", ext},
	} {
		if out, err := exec.Command(openssl, args...).CombinedOutput(); err != nil {
			t.Fatalf("openssl %s: %v\n%s", args[0], err, out)
		}
	}
	return f
}

// curlTLS posts a chat completion to url with curl --cacert and returns
// the HTTP version, the replica and the body.
func curlTLS(t *testing.T, ca, url string, stream bool, http2 bool) (version, replica, body string) {
	t.Helper()
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Skip("curl is not installed")
	}
	hdrs := filepath.Join(t.TempDir(), "headers")
	args := []string{"-sS", "--max-time", "20", "--cacert", ca, "-D", hdrs, "-w", "\n%{http_version} %{http_code}",
		"-H", "Content-Type: application/json", "-H", "X-Session-ID: tls-1",
		"--data-binary", string(chatBody("llama", "sys", "over TLS", stream)), url + "/v1/chat/completions"}
	if http2 {
		args = append([]string{"--http2"}, args...)
	} else {
		args = append([]string{"--http1.1"}, args...)
	}
	out, err := exec.Command(curl, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("curl %s: %v\n%s", url, err, out)
	}
	s := string(out)
	i := strings.LastIndex(s, "\n")
	vc := strings.Fields(s[i+1:])
	if len(vc) != 2 || vc[1] != "200" {
		t.Fatalf("curl %s: %q", url, s)
	}
	h, _ := os.ReadFile(hdrs)
	for _, l := range strings.Split(string(h), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.EqualFold(k, "x-replica") {
			replica = strings.TrimSpace(v)
		}
	}
	return vc[0], replica, s[:i]
}

// checkTLSFront drives a TLS frontend at url: curl over HTTP/2 and
// HTTP/1.1 (plain and streamed), plain HTTP refused, and the openai npm
// client streaming with the test CA trusted (NODE_EXTRA_CA_CERTS).
func checkTLSFront(t *testing.T, certs tlsFiles, url string) {
	v, rep, body := curlTLS(t, certs.CA, url, false, true)
	if v != "2" || rep == "" || !strings.Contains(body, `"choices"`) {
		t.Errorf("h2: version %s replica %q body %s", v, rep, body)
	}
	v, rep2, body := curlTLS(t, certs.CA, url, true, false)
	if v != "1.1" || rep2 != rep || !strings.Contains(body, "data: [DONE]") || strings.Count(body, "data: ") < 3 {
		t.Errorf("http/1.1 stream: version %s replica %q (session on %q) body %s", v, rep2, rep, body)
	}
	// Without the CA the certificate is refused: TLS is really on.
	if out, err := exec.Command("curl", "-sS", "--max-time", "5", url+"/v1/models").CombinedOutput(); err == nil {
		t.Errorf("curl without --cacert succeeded: %s", out)
	}
	t.Setenv("NODE_EXTRA_CA_CERTS", certs.CA)
	checkOpenAINode(t, url, "llama")
}

// HAProxy terminates TLS (h2 and http/1.1, TLSv1.2+) on the SPOE path, its
// workers running as nobody in a chroot that holds the rendered directory:
// the SPOE socket turnout hands them is reached at its in-chroot path.
func TestTLSHAProxy(t *testing.T) { testTLSHAProxy(t, "spoe") }

// The same on the Lua path: the Lua file is read before the chroot, the
// turnout_route hop's socket is reached at its in-chroot path.
func TestTLSHAProxyLua(t *testing.T) { testTLSHAProxy(t, "lua") }

func testTLSHAProxy(t *testing.T, path string) {
	NeedHAProxy(t)
	certs := makeCerts(t)
	root := t.TempDir()
	dir := filepath.Join(root, "haproxy")
	for _, d := range []string{root, dir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ms := mocks(t, "tls-ha", 2, nil)
	turnoutAddr, haAddr := FreeAddr(t), FreeAddr(t)
	front := fmt.Sprintf("tls: {cert: %s}", certs.Cert)
	if os.Geteuid() == 0 {
		front += fmt.Sprintf(", user: nobody, group: nogroup, chroot: %s", root)
	}
	y := fmt.Sprintf(`listen: %s
feedback: {syslog: %s}
health: {interval: 300ms, timeout: 300ms}
haproxy:
  listen: %s
  dir: %s
  path: %s
  %s
  extra:
    frontend: ["http-response set-header X-TLS-Front yes"]
deployments:
  - name: llama
    models: [llama]
    policy: {name: session-hash}
    pools:
      - role: mixed
        endpoints:
          - {name: %s, address: %q}
          - {name: %s, address: %q}
`, turnoutAddr, FreeUDPAddr(t), haAddr, dir, path, strings.ReplaceAll(front, ", ", "\n  "), ms[0].Name, ms[0].Addr, ms[1].Name, ms[1].Addr)
	tu := StartTurnout(t, turnoutAddr, y, "--haproxy-dir", dir, "--watch", "100ms")
	h := StartRenderedHAProxy(t, dir, haAddr)
	h.WaitServersUp(t, "llama_mixed/"+ms[0].Name, "llama_mixed/"+ms[1].Name)
	url := "https://127.0.0.1:" + strings.Split(haAddr, ":")[1]
	checkTLSFront(t, certs, url)
	// Routed by turnout (the SPOE agent answered), not balanced by HAProxy alone.
	if n, err := Metric(t, tu.URL+"/metrics", "turnout_decisions_total"); err != nil || n < 3 {
		t.Errorf("turnout_decisions_total = %v (%v): HAProxy did not ask turnout", n, err)
	}
	// Sync keeps the extra lines and TLS settings: a reload of turnout's
	// config syncs HAProxy without reloading it.
	tu.Rewrite(t, strings.Replace(y, "health: {", "decision_ttl: 9m\nhealth: {", 1))
	Eventually(t, 10*time.Second, "turnout to apply the rewritten config", func() bool {
		b, _ := os.ReadFile(tu.Log)
		return strings.Contains(string(b), "config reloaded")
	})
	time.Sleep(500 * time.Millisecond) // the proxy sync that follows
	if b, _ := os.ReadFile(tu.Log); strings.Contains(string(b), "reloading HAProxy") {
		t.Errorf("the same HAProxy render reloaded HAProxy:\n%s", b)
	}
	// turnout check agrees: the config, the replicas, haproxy -c.
	out, err := exec.Command(TurnoutBin(t), "check", "--config", tu.ConfigPath, "--proxy", "haproxy").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "check passed") {
		t.Errorf("turnout check: %v\n%s", err, out)
	}
}

// nginx terminates TLS (listen ... ssl http2) in body mode (njs).
func TestTLSNginx(t *testing.T) {
	NeedNginx(t)
	certs := makeCerts(t)
	dir := t.TempDir()
	ms := mocks(t, "tls-ng", 2, nil)
	turnoutAddr, ngAddr := FreeAddr(t), FreeAddr(t)
	y := fmt.Sprintf(`listen: %s
feedback: {syslog: %s}
health: {interval: 300ms, timeout: 300ms}
nginx:
  listen: %s
  dir: %s
  mode: body
  tls: {cert: %s, key: %s, min_version: TLSv1.2, alpn: [h2, http/1.1]}
  extra:
    server: ["add_header X-TLS-Front yes always;"]
deployments:
  - name: llama
    models: [llama]
    policy: {name: session-hash}
    pools:
      - role: mixed
        endpoints:
          - {name: %s, address: %q}
          - {name: %s, address: %q}
`, turnoutAddr, FreeUDPAddr(t), ngAddr, dir, certs.Cert, certs.Key, ms[0].Name, ms[0].Addr, ms[1].Name, ms[1].Addr)
	extra := []string{"--nginx-dir", dir, "--watch", "100ms"}
	if os.Geteuid() == 0 {
		extra = append(extra, "--nginx-user", "root") // nobody cannot enter t.TempDir()
	}
	tu := StartTurnout(t, turnoutAddr, y, extra...)
	Eventually(t, 20*time.Second, "turnout to write nginx.conf", func() bool {
		_, err := os.Stat(filepath.Join(dir, nginx.ConfigFile))
		return err == nil
	})
	StartNginx(t, dir, ngAddr)
	url := "https://127.0.0.1:" + strings.Split(ngAddr, ":")[1]
	Eventually(t, 10*time.Second, "replicas healthy", func() bool {
		b, err := exec.Command("curl", "-s", tu.URL+"/readyz").Output()
		return err == nil && strings.Contains(string(b), "ready")
	})
	checkTLSFront(t, certs, url)
	if n, err := Metric(t, tu.URL+"/metrics", "turnout_decisions_total"); err != nil || n < 3 {
		t.Errorf("turnout_decisions_total = %v (%v): nginx did not ask turnout", n, err)
	}
}
