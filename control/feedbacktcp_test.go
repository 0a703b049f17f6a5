package control

import (
	"net"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/lab/testenv/freeport"
	"github.com/turnout/turnout/route"
)

// The feedback address takes TCP only for HAProxy's ring: with the default
// (udp) a TCP socket someone else holds on the same port does not stop
// turnout, and nothing listens there on TCP; with ring the same port is
// refused, naming feedback.syslog, and a free one is served on TCP too.
func TestFeedbackTCPOnlyForRing(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	busyTCP := taken.Addr().String()
	prepare := func(syslog, mode string) (*listeners, error) {
		t.Helper()
		cfg := lnConfig(t, freeport.Addr(t), "feedback: {syslog: "+syslog+"}\nhaproxy: {feedback: "+mode+"}\n")
		srv, err := route.New(cfg, route.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Close)
		log := zerolog.Nop()
		l := newListeners(newCore(srv), "", &log)
		t.Cleanup(func() { l.shutdown(t.Context()) })
		_, err = l.prepare(cfg)
		return l, err
	}
	if _, err := prepare(busyTCP, "udp"); err != nil {
		t.Fatalf("udp feedback refused for a port taken on TCP only: %v", err)
	}
	_, err = prepare(busyTCP, "ring")
	if err == nil || !strings.Contains(err.Error(), "feedback.syslog") {
		t.Fatalf("ring feedback on a port taken on TCP: %v, want a refusal naming feedback.syslog", err)
	}
	free := freeport.Addr(t)
	if _, err := prepare(free, "udp"); err != nil {
		t.Fatal(err)
	}
	if dials(free) {
		t.Error("udp feedback listens on TCP")
	}
	ring := freeport.Addr(t)
	if _, err := prepare(ring, "ring"); err != nil {
		t.Fatal(err)
	}
	if !dials(ring) {
		t.Error("ring feedback does not listen on TCP")
	}
}
