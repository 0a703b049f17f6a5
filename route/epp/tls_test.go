package epp

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route"
)

// The listener's TLS modes over loopback: self-signed (a gateway that
// does not verify connects), files, and off (plaintext h2c); the
// plaintext health listener serves the probes beside a TLS one.
func TestEPP_TLSModes(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	writeCert(t, certFile, keyFile)
	skipVerify := credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}) //nolint:gosec // what gateways do with the EPP's certificate
	for _, tc := range []struct {
		name  string
		tls   config.EPPTLSConfig
		creds credentials.TransportCredentials
	}{
		{"self-signed", config.EPPTLSConfig{Mode: config.EPPTLSSelfSigned}, skipVerify},
		{"files", config.EPPTLSConfig{Mode: config.EPPTLSFiles, CertFile: certFile, KeyFile: keyFile}, skipVerify},
		{"off", config.EPPTLSConfig{Mode: config.EPPTLSOff}, insecure.NewCredentials()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.ParseConfig([]byte(flowYAML))
			if err != nil {
				t.Fatal(err)
			}
			d, err := route.New(cfg, route.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			s, err := New(d, Options{TLS: tc.tls})
			if err != nil {
				t.Fatal(err)
			}
			ln := listen(t)
			hln := listen(t)
			l := s.Serve(ln, hln)
			defer func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				l.Shutdown(ctx)
			}()
			check(t, ln.Addr().String(), tc.creds, HealthReadiness)
			check(t, hln.Addr().String(), insecure.NewCredentials(), HealthLiveness)
		})
	}
}

// A mounted certificate that changes is served from the next check on.
func TestEPP_CertFilesReload(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	writeCert(t, certFile, keyFile)
	nop := zerolog.Nop()
	r := &certFiles{cert: certFile, key: keyFile, log: &nop}
	if err := r.load(); err != nil {
		t.Fatal(err)
	}
	before, _ := r.get(nil)
	time.Sleep(10 * time.Millisecond) // a later modification time on coarse clocks
	writeCert(t, certFile, keyFile)
	r.checked = time.Time{} // the check interval passed
	after, _ := r.get(nil)
	if string(before.Certificate[0]) == string(after.Certificate[0]) {
		t.Fatal("the rewritten certificate was not reloaded")
	}
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func check(t *testing.T, addr string, creds credentials.TransportCredentials, svc string) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
	if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("%s at %s: %v %v", svc, addr, r.GetStatus(), err)
	}
}

func writeCert(t *testing.T, certFile, keyFile string) {
	t.Helper()
	c, err := selfSigned(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	key, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}), 0o600); err != nil {
		t.Fatal(err)
	}
}
