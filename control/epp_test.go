package control

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/turnout/turnout/lab/testenv/freeport"
	"github.com/turnout/turnout/route"
	"github.com/turnout/turnout/route/epp"
)

// The config alone serves the Endpoint Picker: epp.listen opens it (its
// health services answer), a TLS change on the same address is refused
// until a restart, and dropping epp.listen closes it.
func TestEPPListener(t *testing.T) {
	a, e := freeport.Addr(t), freeport.Addr(t)
	cfg := lnConfig(t, a, "epp: {listen: "+e+", tls: {mode: off}}\n")
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

	conn, err := grpc.NewClient(e, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: epp.HealthLiveness}); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("liveness: %v %v", r.GetStatus(), err)
	}

	if _, err := l.prepare(lnConfig(t, a, "epp: {listen: "+e+"}\n")); err == nil || !strings.Contains(err.Error(), "epp.tls.mode") {
		t.Errorf("a TLS change on the same address: %v", err)
	}
	ch, err = l.prepare(lnConfig(t, a, ""))
	if err != nil {
		t.Fatal(err)
	}
	l.start(ch)
	l.retire(ch, 0, 0)
	deadline := time.Now().Add(10 * time.Second)
	for dials(e) {
		if time.Now().After(deadline) {
			t.Fatal("epp.listen still open after it was dropped")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
