package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// render --path-prefix writes into --out but every path inside the files
// is under the prefix (a container renders to /out for the host's
// /etc/haproxy/turnout); none names --out.
func TestRenderPathPrefix(t *testing.T) {
	t.Setenv("TURNOUT_LOG_FORMAT", "text")
	for _, target := range []string{"haproxy", "nginx"} {
		out := t.TempDir()
		const prefix = "/etc/turnout-test/" + "proxy"
		var so, se bytes.Buffer
		args := []string{"render", target, "--out", out, "--path-prefix", prefix, "--check=false"}
		if target == "nginx" {
			args = append(args, "--nginx-js-module=-")
		}
		if code := run(args, &so, &se); code != 0 {
			t.Fatalf("%s: exit %d: %s", target, code, se.String())
		}
		name := map[string]string{"haproxy": "haproxy.cfg", "nginx": "nginx.conf"}[target]
		b, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte(out)) {
			t.Errorf("%s: %s names the output directory %s", target, name, out)
		}
		if !bytes.Contains(b, []byte(prefix+"/")) {
			t.Errorf("%s: %s has no path under %s:\n%s", target, name, prefix, b)
		}
	}
	var so, se bytes.Buffer
	if code := run([]string{"render", "haproxy", "--out", t.TempDir(), "--path-prefix", "relative/dir"}, &so, &se); code != 1 || !strings.Contains(se.String(), "must be an absolute path") {
		t.Errorf("relative prefix: exit %d: %s", code, se.String())
	}
}
