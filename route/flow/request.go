package flow

import (
	"strings"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"
)

// Request is what flow control knows of one request: its class (an index
// into the config's classes) and its tenant (a hash; 0 is "no tenant",
// one tenant like any other). Fill it with Classify.
type Request struct {
	Class  int
	Tenant uint64
	// TenantName is the tenant as its metric label spells it (a view, valid
	// during Admit).
	TenantName []byte
	// kind is where the tenant came from.
	kind tenantKind
}

type tenantKind uint8

const (
	tenantNone tenantKind = iota // the order is precedence: a header names the tenant over a key, a key over the session
	tenantSession
	tenantAPIKey
	tenantHeader
)

// headerNames are the flow headers, normalized as route's headers are
// (lower case, '_' as '-').
type headerNames struct {
	priority, tenant, authz []byte
	apiKey                  bool
}

func newHeaderNames(cfg *config.FlowConfig) headerNames {
	return headerNames{priority: norm(cfg.PriorityHeader), tenant: norm(cfg.TenantHeader), authz: []byte("authorization"), apiKey: cfg.TenantAPIKey}
}

func norm(h string) []byte {
	return []byte(strings.ReplaceAll(strings.ToLower(h), "_", "-"))
}

// Classifier fills a Request from the request's headers, model and session.
// is compares a raw header name with a normalized one (route's matcher:
// case and '-'/'_' tolerant).
type Classifier struct {
	c  *Controller
	r  *Request
	is func(raw, norm []byte) bool
}

// Begin starts classifying into r with the default class of model.
func (c *Controller) Begin(r *Request, model []byte, is func(raw, norm []byte) bool) Classifier {
	*r = Request{Class: c.cfg.ClassIndex(c.cfg.DefaultClass)}
	if len(c.cfg.ModelClasses) > 0 && len(model) > 0 {
		if name, ok := c.cfg.ModelClasses[string(model)]; ok {
			r.Class = c.cfg.ClassIndex(name)
		}
	}
	return Classifier{c: c, r: r, is: is}
}

// Header reads one request header.
func (k Classifier) Header(name, value []byte) {
	h := &k.c.hdrs
	r := k.r
	switch {
	case k.is(name, h.priority):
		if i := k.c.classOf(value); i >= 0 {
			r.Class = i
		}
	case k.is(name, h.tenant) && len(value) > 0:
		r.setTenant(value, tenantHeader)
	case h.apiKey && r.kind < tenantAPIKey && len(value) > 0 && k.is(name, h.authz):
		// Only the hash names the tenant: the key never reaches a label.
		r.Tenant, r.TenantName, r.kind = fleet.HashKey(value), nil, tenantAPIKey
	}
}

// Session makes the session the tenant when no tenant header or key named one.
func (k Classifier) Session(s []byte) {
	if len(s) > 0 && k.r.kind == tenantNone {
		k.r.setTenant(s, tenantSession)
	}
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
