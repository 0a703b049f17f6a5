package control

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route"
)

// helloFrame is an HAPROXY-HELLO health check: supported-versions "2.0",
// max-frame-size 16380, healthcheck true.
func helloFrame() []byte {
	f := []byte{1, 0, 0, 0, 1, 0, 0} // HAPROXY-HELLO, FIN, stream 0, frame 0
	f = append(f, 18)
	f = append(f, "supported-versions"...)
	f = append(f, 8, 3, '2', '.', '0') // STRING "2.0"
	f = append(f, 14)
	f = append(f, "max-frame-size"...)
	f = append(f, 3, 252, 240, 6) // UINT32 16380 as an SPOP varint
	f = append(f, 11)
	f = append(f, "healthcheck"...)
	f = append(f, 0x11) // BOOL true
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(f))), f...)
}

// TestListenSPOE: the SPOE listener (listeners.go) binds host:port,
// "unix@/path" and "/path", replaces a stale socket of a previous run, and
// the agent on it answers HAProxy's hello.
func TestListenSPOE(t *testing.T) {
	cfg, err := config.ParseConfig(config.DefaultConfigYAML)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := route.New(cfg, route.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	log := zerolog.Nop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cc := newCore(srv)
	serve := func(addr string) {
		t.Helper()
		ln, err := listenSPOE(addr)
		if err != nil {
			t.Fatalf("%s: %v", addr, err)
		}
		go func() { _ = cc.serveSPOE(ctx, ln, &log) }()
	}
	sock := filepath.Join(t.TempDir(), "spoe.sock")
	for _, addr := range []string{"127.0.0.1:0", "unix@" + sock} {
		serve(addr)
	}
	// The stale socket of a previous run is replaced.
	serve(sock)
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(helloFrame()); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(c) // AGENT-HELLO, then the agent closes a health check
	if err != nil || len(b) < 5 || b[4] != 101 {
		t.Fatalf("answer % x (%v), want AGENT-HELLO", b, err)
	}
	if _, err := listenSPOE("256.0.0.1:1"); err == nil {
		t.Fatal("bad address accepted")
	}
}
