package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const tokenTestConfig = `
deployments:
  - name: llama
    pools: [{role: mixed, endpoints: [{name: a, address: "127.0.0.1:9101"}]}]
`

func writeConfig(t *testing.T, dir, extra string) string {
	t.Helper()
	path := filepath.Join(dir, "turnout.yaml")
	if err := os.WriteFile(path, []byte(extra+tokenTestConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// Issue 28 item 2: feedback is authenticated by default. A config file
// without feedback.token gets one from feedback.token_file, created on
// first load (0600) and read on every later one, so `turnout render` and
// `turnout serve` write and expect the same token.
func TestFeedbackTokenByDefault(t *testing.T) {
	dir := t.TempDir()
	path := writeConfig(t, dir, "")
	c1, err := LoadConfigFile(path) // e.g. turnout render
	if err != nil {
		t.Fatal(err)
	}
	if !tokenRe.MatchString(c1.Feedback.LineToken()) {
		t.Fatalf("token %q", c1.Feedback.LineToken())
	}
	c2, err := LoadConfigFile(path) // turnout serve, later
	if err != nil {
		t.Fatal(err)
	}
	if c2.Feedback.LineToken() != c1.Feedback.LineToken() {
		t.Fatalf("render and serve disagree: %q vs %q", c1.Feedback.LineToken(), c2.Feedback.LineToken())
	}
	fi, err := os.Stat(filepath.Join(dir, DefaultFeedbackTokenFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v %v", fi, err)
	}
	// Another directory, another token: it is not derived from anything public.
	c3, err := LoadConfigFile(writeConfig(t, t.TempDir(), ""))
	if err != nil || c3.Feedback.LineToken() == c1.Feedback.LineToken() {
		t.Fatalf("a second install got the same token (%v)", err)
	}
}

func TestFeedbackTokenFileChoices(t *testing.T) {
	dir := t.TempDir()
	c, err := LoadConfigFile(writeConfig(t, dir, "feedback: {token: explicit-token-0123456789}\n"))
	if err != nil || c.Feedback.Token != "explicit-token-0123456789" {
		t.Fatalf("explicit token: %v %q", err, c.Feedback.Token)
	}
	if _, err := os.Stat(filepath.Join(dir, DefaultFeedbackTokenFile)); err == nil {
		t.Fatal("a token file was created although feedback.token is set")
	}
	c, err = LoadConfigFile(writeConfig(t, dir, "feedback: {token_file: off}\n"))
	if err != nil || c.Feedback.LineToken() != "" {
		t.Fatalf("token_file off: %v %q", err, c.Feedback.LineToken())
	}
	abs := filepath.Join(t.TempDir(), "tok")
	if err := os.WriteFile(abs, []byte("from-a-secret-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err = LoadConfigFile(writeConfig(t, dir, "feedback: {token_file: "+abs+"}\n"))
	if err != nil || c.Feedback.LineToken() != "from-a-secret-0123456789" || c.Feedback.Token != "" {
		t.Fatalf("mounted secret: %v %q", err, c.Feedback.LineToken())
	}
	if err := os.WriteFile(abs, []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadConfigFile(writeConfig(t, dir, "feedback: {token_file: "+abs+"}\n")); err == nil || !strings.Contains(err.Error(), "token_file") {
		t.Fatalf("a bad token was accepted: %v", err)
	}
	// A read-only directory (a ConfigMap mount): no token, a warning.
	ro := t.TempDir()
	path := writeConfig(t, ro, "")
	if err := os.Chmod(ro, 0o555); err != nil {
		t.Fatal(err)
	}
	defer os.Chmod(ro, 0o755)
	if os.Geteuid() == 0 {
		t.Log("root ignores directory permissions: the read-only case is not checked")
		return
	}
	c, err = LoadConfigFile(path)
	if err != nil || c.Feedback.LineToken() != "" || len(c.Warnings()) == 0 {
		t.Fatalf("read-only dir: %v %q %v", err, c.Feedback.LineToken(), c.Warnings())
	}
}
