package config

import "net"

// EPPConfig is the Endpoint Picker (route/epp, docs/gateway-api.md):
// turnout answering Gateway API Inference Extension gateways over Envoy's
// ext_proc gRPC protocol. Off unless Listen is set.
type EPPConfig struct {
	// Listen is the gRPC address gateways call (the reference EPP's
	// port is 9002); "" (default) serves no Endpoint Picker.
	Listen string `yaml:"listen"`
	// HealthListen, when set, is a plaintext gRPC listener serving only
	// the health services (liveness, readiness), for the kubelet's gRPC
	// probes, which do not speak TLS. The services are on Listen too.
	HealthListen string       `yaml:"health_listen"`
	TLS          EPPTLSConfig `yaml:"tls"`
	// Fallbacks caps how many of the decision's fallbacks follow the
	// primary in x-gateway-destination-endpoint and the envoy.lb metadata
	// (nil: all of them, as many as the top-level fallbacks). 0 names the
	// primary alone, for gateways that proxy to the header's value as one
	// address (NGINX Gateway Fabric's shim).
	Fallbacks *int `yaml:"fallbacks"`
	// Server is the gRPC server of Listen: inline (default: turnout's own
	// HTTP/2 server, read and decided on each connection's goroutine) or
	// grpc (grpc-go).
	Server string `yaml:"server"`
}

// ListedPicks is how many endpoints the Endpoint Picker lists out of n
// picked (the primary and its fallbacks).
func (e *EPPConfig) ListedPicks(n int) int {
	if e.Fallbacks == nil {
		return n
	}
	return min(n, 1+*e.Fallbacks)

}

// Endpoint Picker servers (epp.server).
const (
	EPPServerInline = "inline"
	EPPServerGRPC   = "grpc"
)

// EPPTLSConfig is the Endpoint Picker listener's TLS.
type EPPTLSConfig struct {
	// Mode is self-signed (default: a certificate made at start, as the
	// reference EPP does; gateways do not verify it), files (CertFile and
	// KeyFile, read again when they change) or off (plaintext h2c).
	Mode     string `yaml:"mode"`
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

// Endpoint Picker TLS modes (epp.tls.mode).
const (
	EPPTLSSelfSigned = "self-signed"
	EPPTLSFiles      = "files"
	EPPTLSOff        = "off"
)

// On reports whether the Endpoint Picker is served.
func (e *EPPConfig) On() bool { return e.Listen != "" }

func (c *Config) applyEPPDefaults() {
	orDefault(&c.EPP.TLS.Mode, EPPTLSSelfSigned)
	orDefault(&c.EPP.Server, EPPServerInline)
}

func (c *Config) validateEPP(bad func(field, format string, a ...any)) {
	e := &c.EPP
	if e.Fallbacks != nil && *e.Fallbacks < 0 {
		bad("epp.fallbacks", "%d is negative (0 lists the primary alone)", *e.Fallbacks)
	}
	if !e.On() {
		if e.HealthListen != "" {
			bad("epp.health_listen", "is set without epp.listen")
		}
		return
	}
	taken := map[string]string{c.Listen: "listen", c.AdminListen: "admin_listen"}
	for _, a := range []struct{ field, addr string }{{"epp.listen", e.Listen}, {"epp.health_listen", e.HealthListen}} {
		if a.addr == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(a.addr); err != nil {
			bad(a.field, "%q is not host:port", a.addr)
			continue
		}
		if other, ok := taken[a.addr]; ok {
			bad(a.field, "%q is %s's address: the Endpoint Picker needs its own port", a.addr, other)
		}
		taken[a.addr] = a.field
	}
	if e.Server != EPPServerInline && e.Server != EPPServerGRPC {
		bad("epp.server", "%q is neither %s nor %s", e.Server, EPPServerInline, EPPServerGRPC)
	}
	t := &e.TLS
	switch t.Mode {
	case EPPTLSSelfSigned, EPPTLSOff:
		if t.CertFile != "" || t.KeyFile != "" {
			bad("epp.tls.mode", "%q ignores cert_file and key_file (set mode: files)", t.Mode)
		}
	case EPPTLSFiles:
		if t.CertFile == "" {
			bad("epp.tls.cert_file", "is required with mode: files")
		}
		if t.KeyFile == "" {
			bad("epp.tls.key_file", "is required with mode: files")
		}
	default:
		bad("epp.tls.mode", "%q is not one of self-signed, files, off", t.Mode)
	}
}
