package control

import (
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/lab/testenv/freeport"
	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/contract"
)

func lnConfig(t *testing.T, listen, extra string) *config.Config {
	t.Helper()
	if !strings.Contains(extra, "feedback") {
		// Not the default port: tests of other packages run at the same time.
		extra += "feedback: {syslog: " + freeport.Addr(t) + "}\n"
	}
	c, err := config.ParseConfig([]byte("listen: " + listen + "\nhealth: {disable: true}\n" + extra +
		"deployments: [{name: d, pools: [{endpoints: [{name: a, address: 127.0.0.1:1}]}]}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func dials(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err == nil {
		c.Close()
	}
	return err == nil
}

// The listener set opens new addresses before the old ones close, names
// the field of an address it cannot bind, refuses a limits change on an
// unchanged address, and takes a draining listener back.
func TestListenersLifecycle(t *testing.T) {
	a1 := freeport.Addr(t)
	cfg := lnConfig(t, a1, "")
	srv, err := route.New(cfg, route.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	log := zerolog.Nop()
	l := newListeners(newCore(srv), "", &log)
	defer l.shutdown(t.Context())
	ch, err := l.prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l.start(ch)
	if !dials(a1) {
		t.Fatal("not listening")
	}

	busy, _ := net.Listen("tcp", "127.0.0.1:0")
	defer busy.Close()
	if _, err := l.prepare(lnConfig(t, busy.Addr().String(), "")); err == nil || !strings.Contains(err.Error(), "listen: listen tcp "+busy.Addr().String()) {
		t.Errorf("busy address: %v", err)
	}
	if _, err := l.prepare(lnConfig(t, a1, "limits: {max_conns: 10}\n")); err == nil || !strings.Contains(err.Error(), "limits.max_conns") {
		t.Errorf("limits change on the same address: %v", err)
	}

	a2 := freeport.Addr(t)
	ch, err = l.prepare(lnConfig(t, a2, ""))
	if err != nil {
		t.Fatal(err)
	}
	l.start(ch)
	l.retire(ch, time.Hour, time.Hour)
	if !dials(a1) || !dials(a2) {
		t.Fatal("both addresses must serve while the old one drains")
	}
	// Back to a1 while it drains: the same listener serves again.
	ch, err = l.prepare(lnConfig(t, a1, ""))
	if err != nil {
		t.Fatalf("return to a draining address: %v", err)
	}
	l.start(ch)
	l.retire(ch, 10*time.Millisecond, time.Hour)
	deadline := time.Now().Add(3 * time.Second)
	for dials(a2) {
		if time.Now().After(deadline) {
			t.Fatal("the replaced listener did not close after its grace")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !dials(a1) {
		t.Fatal("the revived listener is not serving")
	}
}

// The default path's SPOE agent listens on DIR/spoe.sock (haproxy.dir or
// --haproxy-dir), none with haproxy.path lua, and moves to haproxy.spoe
// when that is set on a reload.
func TestListenersDefaultSPOESocket(t *testing.T) {
	dir := t.TempDir()
	sock := dir + "/spoe.sock"
	dialsUnix := func() bool {
		c, err := net.DialTimeout("unix", sock, 200*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err == nil
	}
	fb := "feedback: {syslog: " + freeport.Addr(t) + "}\n"
	cfg := lnConfig(t, freeport.Addr(t), "haproxy: {dir: "+dir+"}\n"+fb)
	srv, err := route.New(cfg, route.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	log := zerolog.Nop()
	l := newListeners(newCore(srv), "", &log)
	defer l.shutdown(t.Context())
	ch, err := l.prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l.start(ch)
	if !dialsUnix() {
		t.Fatalf("default path: no agent on %s", sock)
	}

	tcp := freeport.Addr(t)
	ch, err = l.prepare(lnConfig(t, cfg.Listen, "haproxy: {dir: "+dir+", spoe: "+tcp+"}\n"+fb))
	if err != nil {
		t.Fatal(err)
	}
	if len(ch.fields) != 1 || ch.fields[0] != kindSPOE {
		t.Fatalf("fields changed: %v, want [%s]", ch.fields, kindSPOE)
	}
	l.start(ch)
	l.retire(ch, 0, 0)
	if !dials(tcp) {
		t.Fatalf("haproxy.spoe %s: no agent", tcp)
	}
	for deadline := time.Now().Add(5 * time.Second); dialsUnix(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the old socket still accepts after its grace")
		}
	}

	// haproxy.path lua with a --haproxy-dir: no agent at all.
	lua := lnConfig(t, freeport.Addr(t), "haproxy: {path: lua}\n")
	withDir := newListeners(l.core, dir, &log)
	if a := withDir.spoeAddr(lua); a != "" {
		t.Errorf("haproxy.path lua: agent address %q, want none", a)
	}
	if a := withDir.spoeAddr(lnConfig(t, freeport.Addr(t), "")); a != "unix@"+sock {
		t.Errorf("--haproxy-dir: agent address %q, want unix@%s", a, sock)
	}
}

// admin_listen opens, serves only the admin paths, moves on reload (new
// address first, old one after its grace), and closes when removed.
func TestListenersAdmin(t *testing.T) {
	listen, adm1, adm2 := freeport.Addr(t), freeport.Addr(t), freeport.Addr(t)
	cfg := lnConfig(t, listen, "admin_listen: "+adm1+"\n")
	srv, err := route.New(cfg, route.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	log := zerolog.Nop()
	l := newListeners(newCore(srv), "", &log)
	defer l.shutdown(t.Context())
	ch, err := l.prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l.start(ch)
	status := func(addr, path string) int {
		res, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0
		}
		res.Body.Close()
		return res.StatusCode
	}
	if s := status(adm1, contract.PathHealthz); s != 200 {
		t.Fatalf("admin /healthz: %d", s)
	}
	if s := status(adm1, contract.PathRoute); s != 404 {
		t.Fatalf("admin %s: %d, want 404", contract.PathRoute, s)
	}
	ch, err = l.prepare(lnConfig(t, listen, "admin_listen: "+adm2+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	l.start(ch)
	l.retire(ch, 10*time.Millisecond, time.Second)
	if s := status(adm2, contract.PathMetrics); s != 200 {
		t.Fatalf("new admin address /metrics: %d", s)
	}
	deadline := time.Now().Add(5 * time.Second)
	for dials(adm1) {
		if time.Now().After(deadline) {
			t.Fatal("old admin address still open after its grace")
		}
		time.Sleep(20 * time.Millisecond)
	}
	ch, err = l.prepare(lnConfig(t, listen, ""))
	if err != nil {
		t.Fatal(err)
	}
	l.start(ch)
	l.retire(ch, 10*time.Millisecond, time.Second)
	for dials(adm2) {
		if time.Now().After(deadline) {
			t.Fatal("admin listener still open after admin_listen was removed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !dials(listen) {
		t.Fatal("the route API listener must stay")
	}
}
