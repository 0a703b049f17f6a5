package config

import (
	"cmp"
	"fmt"
	"path"
	"time"
)

// Models and LoRA adapters (docs/models.md): which endpoints serve which
// model names. turnout learns each endpoint's list from GET /v1/models
// (health.models_interval) and from the engine's vllm:lora_requests_info;
// endpoints' and pools' models: pin it instead, and a deployment's lora:
// names the adapters it routes.

// LoRAConfig names the adapters a deployment routes and how turnout
// treats them.
type LoRAConfig struct {
	// Parents: every adapter whose parent (GET /v1/models) is one of these
	// is routed by this deployment. Default: the deployment's models.
	Parents []string `yaml:"parents"`
	// Adapters are name patterns (path.Match: *, ?, [a-z]) of adapters
	// routed by this deployment whatever their parent.
	Adapters []string `yaml:"adapters"`
	// LoadOnDemand loads an adapter no endpoint holds on the chosen one
	// (POST /v1/load_lora_adapter) before answering. Off by default. It
	// loads only names the operator lists (Allow, AdapterPaths' keys), or
	// with LoadPatterns any name matching Adapters: a client picks the
	// name, and every load costs the fleet.
	LoadOnDemand bool `yaml:"load_on_demand"`
	// Allow are the adapter names LoadOnDemand may load.
	Allow []string `yaml:"allow"`
	// LoadPatterns lets LoadOnDemand load any name matching Adapters.
	LoadPatterns bool `yaml:"load_patterns"`
	// MaxLoadsPerMinute bounds the loads on demand this deployment starts
	// (default DefaultMaxLoadsPerMinute); past it a request is answered as
	// if nothing could load its adapter.
	MaxLoadsPerMinute int `yaml:"max_loads_per_minute"`
	// LoadTimeout bounds that wait (default 10s).
	LoadTimeout Duration `yaml:"load_timeout"`
	// AdapterPaths maps an adapter name to the lora_path a load sends;
	// default: the name itself.
	AdapterPaths map[string]string `yaml:"adapter_paths"`
	// MaxLoaded unloads the least recently routed adapter an endpoint got
	// through load_on_demand past this many (0: never unload).
	MaxLoaded int `yaml:"max_loaded"`
}

// ParentsOf are the parents whose adapters d routes.
func (d *DeploymentConfig) ParentsOf() []string {
	if d.LoRA.Parents != nil {
		return d.LoRA.Parents
	}
	return d.Models
}

// ClaimsAdapter reports whether d routes adapter id with that parent.
func (d *DeploymentConfig) ClaimsAdapter(id, parent string) bool {
	for _, p := range d.ParentsOf() {
		if parent != "" && p == parent {
			return true
		}
	}
	for _, pat := range d.LoRA.Adapters {
		if ok, _ := path.Match(pat, id); ok {
			return true
		}
	}
	return false
}

// DefaultMaxLoadsPerMinute is lora.max_loads_per_minute's default.
const DefaultMaxLoadsPerMinute = 30

// LoadsPerMinute is lora.max_loads_per_minute with its default.
func (l *LoRAConfig) LoadsPerMinute() int {
	return cmp.Or(l.MaxLoadsPerMinute, DefaultMaxLoadsPerMinute)
}

// DefaultModelsInterval is how often GET /v1/models is asked of every endpoint.
const DefaultModelsInterval = 10 * time.Second

// validateModels checks the models and lora sections of deployment i.
func validateModels(f string, d *DeploymentConfig, bad func(field, format string, args ...any)) {
	for j, pat := range d.LoRA.Adapters {
		if _, err := path.Match(pat, ""); err != nil || pat == "" {
			bad(fmt.Sprintf("%s.lora.adapters[%d]", f, j), "%q is not a name pattern (path.Match: *, ?, [a-z])", pat)
		}
	}
	if t := d.LoRA.LoadTimeout.D(); t < 0 || t > 10*time.Minute {
		bad(f+".lora.load_timeout", "%v out of range [0, 10m] (0: 10s)", t)
	}
	if m := d.LoRA.MaxLoadsPerMinute; m < 0 || m > 6000 {
		bad(f+".lora.max_loads_per_minute", "%d out of range [0, 6000] (0: %d)", m, DefaultMaxLoadsPerMinute)
	}
	for j, n := range d.LoRA.Allow {
		if n == "" || len(n) > 256 {
			bad(fmt.Sprintf("%s.lora.allow[%d]", f, j), "empty or longer than 256")
		}
	}
	if d.LoRA.MaxLoaded < 0 || d.LoRA.MaxLoaded > 10000 {
		bad(f+".lora.max_loaded", "%d out of range [0, 10000] (0: never unload)", d.LoRA.MaxLoaded)
	}
	check := func(field string, ms []string) {
		for k, m := range ms {
			if m == "" || len(m) > 256 {
				bad(fmt.Sprintf("%s[%d]", field, k), "empty or longer than 256")
			}
		}
	}
	for j := range d.Pools {
		p := &d.Pools[j]
		pf := fmt.Sprintf("%s.pools[%d]", f, j)
		check(pf+".models", p.Models)
		for k := range p.Endpoints {
			check(fmt.Sprintf("%s.endpoints[%d].models", pf, k), p.Endpoints[k].Models)
		}
	}
}

// PinnedModels is what the config pins for an endpoint of pool p: the
// endpoint's own models:, else the pool's (nil: learned).
func PinnedModels(p *PoolConfig, e *EndpointConfig) []string {
	if e.Models != nil {
		return e.Models
	}
	return p.Models
}

// validateModelsInterval checks health.models_interval.
func validateModelsInterval(c *Config, bad func(field, format string, args ...any)) {
	if mi := c.Health.ModelsInterval.D(); mi < 0 || mi > 0 && mi < 100*time.Millisecond || mi > 10*time.Minute {
		bad("health.models_interval", "%v out of range [100ms, 10m] (0: %v)", mi, DefaultModelsInterval)
	}
	if mw := c.Health.ModelsWait.D(); mw < 0 || mw > 10*time.Minute {
		bad("health.models_wait", "%v out of range [0, 10m] (0: %v)", mw, DefaultModelsWait)
	}
}

// DefaultModelsWait bounds /readyz's wait for an endpoint's first model list.
const DefaultModelsWait = 10 * time.Second

// ModelsWaitOr is health.models_wait with its default.
func (h *HealthConfig) ModelsWaitOr() time.Duration {
	return cmp.Or(h.ModelsWait.D(), DefaultModelsWait)
}

// PoolMinReady is how many available endpoints pool p needs for its
// models to count as ready: its own min_ready, else health.min_ready,
// else 1. 0 means the pool may be empty.
func (c *Config) PoolMinReady(p *PoolConfig) int {
	switch {
	case p.MinReady != nil:
		return *p.MinReady
	case c.Health.MinReady != nil:
		return *c.Health.MinReady
	}
	return 1
}

// ModelsEvery is health.models_interval with its default.
func (h *HealthConfig) ModelsEvery() time.Duration {
	return cmp.Or(h.ModelsInterval.D(), DefaultModelsInterval)
}
