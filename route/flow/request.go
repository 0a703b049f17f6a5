package flow

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"
)

// Request is what flow control knows of one request: its class (an index
// into the config's classes) and its tenant (a hash; 0 is the shared
// tenant of every request without a trusted one). Fill it with Classify.
type Request struct {
	Class  int
	Tenant uint64
	// TenantName is the tenant as its metric label spells it (a view, valid
	// during Admit).
	TenantName []byte
	// Bytes is what holding the request keeps in memory (its frame or
	// body and headers): counted against limits.max_buffered_bytes.
	Bytes int64
	// SLOMs is its time-to-first-token objective in ms (0: none; slo.go).
	SLOMs int32
	// kind is where the tenant came from.
	kind tenantKind
}

type tenantKind uint8

const (
	tenantNone   tenantKind = iota // the shared tenant
	tenantAPIKey                   // a tenant_keys entry
	tenantHeader                   // a trusted tenant header
)

// Inputs are the values of the request's flow headers, which route reads
// in its one pass over the headers (nil: absent). Classify decides what
// of them counts.
type Inputs struct {
	Priority, Tenant, Authorization []byte
	// SLO is the trusted TTFT objective header's value (slo.go).
	SLO []byte
}

// tenantKeys maps the SHA-256 of an Authorization value to its tenant name.
type tenantKeys map[[sha256.Size]byte][]byte

func newTenantKeys(cfg *config.FlowConfig) tenantKeys {
	if !cfg.TenantAPIKey || len(cfg.TenantKeys) == 0 {
		return nil
	}
	m := tenantKeys{}
	for h, name := range cfg.TenantKeys {
		var k [sha256.Size]byte
		if b, err := hex.DecodeString(strings.ToLower(h)); err == nil && len(b) == sha256.Size {
			copy(k[:], b)
			m[k] = []byte(name)
		}
	}
	return m
}

// Classify fills r for a request for model: its class is the priority
// header's when the config trusts that header, else the model's default;
// its tenant is the tenant header's when trusted, else the tenant_keys
// entry of its Authorization, else the shared tenant. What a client sends
// on its own never buys a class or a turn of its own.
func (c *Controller) Classify(r *Request, model []byte, in *Inputs) {
	*r = Request{Class: c.defClass}
	if len(c.cfg.ModelClasses) > 0 && len(model) > 0 {
		if name, ok := c.cfg.ModelClasses[string(model)]; ok {
			r.Class = c.cfg.ClassIndex(name)
		}
	}
	tr := c.cfg.Trust
	if tr.PriorityHeader && len(in.Priority) > 0 {
		if i := c.classOf(in.Priority); i >= 0 {
			r.Class = i
		}
	}
	switch {
	case tr.TenantHeader && len(in.Tenant) > 0:
		r.setTenant(in.Tenant, tenantHeader)
	case c.keys != nil && len(in.Authorization) > 0:
		if name, ok := c.keys[sha256.Sum256(in.Authorization)]; ok {
			r.Tenant, r.TenantName, r.kind = fleet.HashKey(name), name, tenantAPIKey
		}
	}
	r.SLOMs = c.objective(r.Class, in.SLO)
}

func (r *Request) setTenant(v []byte, kind tenantKind) {
	if len(v) > maxTenantName {
		v = v[:maxTenantName]
	}
	r.Tenant, r.TenantName, r.kind = fleet.HashKey(v), v, kind
}

// maxTenantName bounds a tenant label.
const maxTenantName = 64

// classOf finds the class a priority header value names; -1: none.
func (c *Controller) classOf(v []byte) int {
	for i := range c.cfg.Classes {
		cl := &c.cfg.Classes[i]
		if strings.EqualFold(string(v), cl.Name) {
			return i
		}
		for _, x := range cl.Values {
			if strings.EqualFold(string(v), x) {
				return i
			}
		}
	}
	return -1
}
