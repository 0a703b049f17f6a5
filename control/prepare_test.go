package control

import (
	"net"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/lab/testenv/freeport"
	"github.com/turnout/turnout/route"
)

// A prepare that fails after binding the SPOE agent (here: the feedback
// port is taken) drops the agent it never served and returns the error,
// instead of waiting forever for an agent goroutine that never started.
func TestPrepareFailsAfterSPOEBind(t *testing.T) {
	busy, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	spoe := freeport.Addr(t)
	cfg := lnConfig(t, freeport.Addr(t), "feedback: {syslog: "+busy.LocalAddr().String()+"}\nhaproxy: {spoe: "+spoe+"}\n")
	srv, err := route.New(cfg, route.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	log := zerolog.Nop()
	l := newListeners(newCore(srv), "", &log)
	defer l.shutdown(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := l.prepare(cfg)
		errc <- err
	}()
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("prepare bound a taken feedback port")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("prepare hung stopping the SPOE agent it never served")
	}
	if dials(spoe) {
		t.Error("the dropped SPOE agent still listens")
	}
}
