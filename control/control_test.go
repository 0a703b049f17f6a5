package control

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/haproxy"
	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/lab/testenv/freeport"
	"github.com/turnout/turnout/route"
)

// runLoop starts New(opts).Run for cfg and stops it at cleanup, failing the
// test if Run returned an error.
func runLoop(t *testing.T, cfg *config.Config, opts Options) {
	t.Helper()
	srv, err := route.New(cfg, route.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	l, err := New(srv, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx, cfg) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// turnout serve --haproxy-dir DIR creates DIR when it does not exist yet
// (a fresh machine, make demo K8S=1): the SPOE agent listens on
// DIR/spoe.sock and the proxy worker writes the HAProxy files there.
func TestHAProxyDirCreated(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "not", "yet")
	cfg := lnConfig(t, freeport.Addr(t), "")
	log := zerolog.Nop()
	runLoop(t, cfg, Options{Log: &log, HAProxy: haproxy.SyncOptions{Dir: dir, HAProxyBin: "-"}})
	sock := filepath.Join(dir, haproxy.SPOESocketName)
	eventually(t, "the SPOE agent on "+sock, func() bool {
		c, err := net.DialTimeout("unix", sock, 200*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	eventually(t, "haproxy.cfg written by the first sync", func() bool {
		_, err := os.Stat(filepath.Join(dir, "haproxy.cfg"))
		return err == nil
	})
}

// A config file change reaches the listeners through the loop: the new
// listen address serves next to the old one (no proxy managed: the old one
// stays for its grace), and a broken file changes nothing.
func TestReloadOnFileChange(t *testing.T) {
	path := filepath.Join(t.TempDir(), "turnout.yaml")
	write := func(listen string) {
		t.Helper()
		b := []byte("listen: " + listen + "\nhealth: {disable: true}\nfeedback: {disable: true}\n" +
			"deployments: [{name: d, pools: [{endpoints: [{name: a, address: 127.0.0.1:1}]}]}]\n")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	a1, a2 := freeport.Addr(t), freeport.Addr(t)
	write(a1)
	log := zerolog.Nop()
	opts := Options{ConfigPath: path, Watch: 20 * time.Millisecond, Log: &log}
	cfg, err := opts.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	runLoop(t, cfg, opts)
	eventually(t, "listen "+a1, func() bool { return dials(a1) })
	write(a2)
	eventually(t, "listen "+a2+" after the file changed", func() bool { return dials(a2) })
	if !dials(a1) {
		t.Error("the replaced listener closed at once; it must serve for its grace")
	}
	if err := os.WriteFile(path, []byte("listen: [\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // several polls
	if !dials(a2) {
		t.Error("a broken config file took the listener down")
	}
}

// A config that replaces one the proxy worker has not taken yet keeps the
// longer drain: the servers the replaced config removed (static endpoints
// of a file reload) are removed by the newer one, and still owed their drain.
func TestPushKeepsLongerDrain(t *testing.T) {
	p := &proxies{ch: make(chan syncReq, 1)}
	full := &config.Config{HAProxy: config.HAProxyConfig{DrainTimeout: config.Duration(30 * time.Second)}}
	none := &config.Config{}
	p.push(full, nil)
	p.push(none, nil)
	req := <-p.ch
	if req.cfg.HAProxy.DrainTimeout.D() != 30*time.Second {
		t.Errorf("merged push drains %v, want the replaced config's 30s", req.cfg.HAProxy.DrainTimeout.D())
	}
	if none.HAProxy.DrainTimeout != 0 {
		t.Error("push changed the caller's config")
	}
	p.push(none, nil)
	p.push(full, nil)
	if req := <-p.ch; req.cfg != full {
		t.Error("a newer config with the longer drain was not taken as is")
	}
}
