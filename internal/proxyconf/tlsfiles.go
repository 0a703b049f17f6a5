package proxyconf

import (
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"time"

	"github.com/turnout/turnout/internal/config"
)

// CheckTLSFiles checks, on the host that renders or checks, that a frontend
// certificate and key (haproxy.tls, nginx.tls) are readable, parse and
// belong together, and that the certificate is in date: the proxy would
// refuse to start, or clients to connect, otherwise. The key is t.Key, else
// for HAProxy (keyBesideCert) Cert+".key" when that file exists, else Cert.
// Errors wrap base and name field.
func CheckTLSFiles(base error, field string, t *config.TLSConfig, keyBesideCert bool) error {
	if !t.Enabled() {
		return nil
	}
	key := t.Key
	if key == "" && keyBesideCert {
		if _, err := os.Stat(t.Cert + ".key"); err == nil {
			key = t.Cert + ".key"
		}
	}
	key = cmp.Or(key, t.Cert)
	for _, f := range []string{t.Cert, key} {
		fh, err := os.Open(f)
		if err != nil {
			return fmt.Errorf("%w: %s: %w", base, field, err)
		}
		fh.Close()
	}
	pair, err := tls.LoadX509KeyPair(t.Cert, key)
	if err != nil {
		return fmt.Errorf("%w: %s: certificate %s and key %s: %w", base, field, t.Cert, key, err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return fmt.Errorf("%w: %s: %s: %w", base, field, t.Cert, err)
	}
	if now := time.Now(); now.After(leaf.NotAfter) || now.Before(leaf.NotBefore) {
		return fmt.Errorf("%w: %s: %s is valid from %s to %s, not now", base, field, t.Cert, leaf.NotBefore.Format(time.RFC3339), leaf.NotAfter.Format(time.RFC3339))
	}
	return nil
}
