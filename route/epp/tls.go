package epp

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"os"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc/credentials"

	"github.com/turnout/turnout/internal/config"
)

// The listener's TLS (epp.tls.mode): a certificate made at start
// (self-signed, the default: gateways call the reference EPP over TLS
// without verifying it), a mounted certificate and key read again when
// they change (files), or none (off: plaintext HTTP/2).

// transportCredentials are the gRPC credentials of c (nil: plaintext).
func transportCredentials(c config.EPPTLSConfig, log *zerolog.Logger) (credentials.TransportCredentials, error) {
	cfg, err := tlsConfig(c, log)
	if cfg == nil || err != nil {
		return nil, err
	}
	return credentials.NewTLS(cfg), nil
}

// tlsConfig is the listener's TLS config of c (nil: plaintext).
func tlsConfig(c config.EPPTLSConfig, log *zerolog.Logger) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	switch c.Mode {
	case config.EPPTLSOff:
		return nil, nil
	case config.EPPTLSFiles:
		r := &certFiles{cert: c.CertFile, key: c.KeyFile, log: log}
		if err := r.load(); err != nil {
			return nil, err
		}
		cfg.GetCertificate = r.get
	default:
		cert, err := selfSigned(time.Now())
		if err != nil {
			return nil, fmt.Errorf("epp.tls: self-signed certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// selfSigned makes a certificate for this process's life (ten years, so
// a long-running instance never outlives it).
func selfSigned(now time.Time) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return tls.Certificate{}, err
	}
	host, _ := os.Hostname()
	names := []string{"localhost"}
	if host != "" {
		names = append(names, host)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"turnout"}, CommonName: "turnout endpoint picker"},
		DNSNames:              names,
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// certFiles serves a mounted certificate, read again when a file's
// modification time or size changes (a Secret's rotation), checked at
// most every certCheckEvery on a handshake.
type certFiles struct {
	cert, key string
	log       *zerolog.Logger

	mu      sync.Mutex
	cur     *tls.Certificate
	stamp   string
	checked time.Time
}

const certCheckEvery = 10 * time.Second

func (r *certFiles) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now := time.Now(); now.Sub(r.checked) >= certCheckEvery {
		r.checked = now
		if s, err := r.fileStamp(); err == nil && s != r.stamp {
			if err := r.loadLocked(); err != nil {
				r.log.Error().Err(err).Msg("epp.tls: the changed certificate files do not load; serving the previous certificate")
			} else {
				r.log.Info().Str("cert_file", r.cert).Msg("epp.tls: certificate reloaded")
			}
		}
	}
	return r.cur, nil
}

func (r *certFiles) load() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.checked = time.Now()
	return r.loadLocked()
}

func (r *certFiles) loadLocked() error {
	stamp, err := r.fileStamp()
	if err != nil {
		return err
	}
	c, err := tls.LoadX509KeyPair(r.cert, r.key)
	if err != nil {
		return fmt.Errorf("epp.tls: cert_file %s, key_file %s: %w", r.cert, r.key, err)
	}
	r.cur, r.stamp = &c, stamp
	return nil
}

func (r *certFiles) fileStamp() (string, error) {
	var s string
	for _, f := range []string{r.cert, r.key} {
		fi, err := os.Stat(f)
		if err != nil {
			return "", fmt.Errorf("epp.tls: %w", err)
		}
		s += fmt.Sprintf("%d/%d;", fi.ModTime().UnixNano(), fi.Size())
	}
	return s, nil
}
