package flow

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/route/fleet"
)

// Set keeps one Controller per deployment with flow control across config
// reloads: a deployment whose flow config is unchanged keeps its
// controller (and what it holds), pointed at the new pool; a changed or
// removed one's controller is closed, releasing what it held.
type Set struct {
	mu    sync.Mutex
	byDep map[string]*Controller
	// held bounds the bytes every controller's held requests keep.
	held budget
}

// SetMaxBytes bounds the bytes held across the set's controllers
// (limits.max_buffered_bytes; 0: unbounded). A request past it is not
// held: shed if its class sheds, else routed at once.
func (s *Set) SetMaxBytes(n int64) { s.held.max.Store(n) }

// HeldBytes is what the held requests keep now.
func (s *Set) HeldBytes() int64 { return s.held.held.Load() }

// NewSet returns an empty set.
func NewSet() *Set { return &Set{byDep: map[string]*Controller{}} }

// Bind returns the controller of deployment dep for cfg and its serving pool.
func (s *Set) Bind(dep string, cfg *config.FlowConfig, pool *fleet.Pool) *Controller {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.byDep[dep]; c != nil {
		if reflect.DeepEqual(c.cfg, cfg) {
			c.SetPool(pool)
			return c
		}
		c.Close()
	}
	c := New(cfg, pool)
	c.budget = &s.held
	s.byDep[dep] = c
	return c
}

// Keep closes the controllers of deployments not in live.
func (s *Set) Keep(live map[string]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for dep, c := range s.byDep {
		if !live[dep] {
			c.Close()
			delete(s.byDep, dep)
		}
	}
}

// Close closes every controller.
func (s *Set) Close() { s.Keep(nil) }

// sorted returns the deployments with flow control in name order and their
// controllers, so metrics and readiness list them alike.
func (s *Set) sorted() ([]string, []*Controller) {
	s.mu.Lock()
	deps := make([]string, 0, len(s.byDep))
	for d := range s.byDep {
		deps = append(deps, d)
	}
	slices.Sort(deps)
	ctrls := make([]*Controller, len(deps))
	for i, d := range deps {
		ctrls[i] = s.byDep[d]
	}
	s.mu.Unlock()
	return deps, ctrls
}

// WriteMetrics renders every controller's metrics (nothing without one).
func (s *Set) WriteMetrics(b *strings.Builder) {
	deps, ctrls := s.sorted()
	if len(ctrls) == 0 {
		return
	}
	var fam [len(families)]strings.Builder
	var slo strings.Builder
	for i, c := range ctrls {
		c.writeMetrics(&fam, deps[i])
		c.writeSLOMetrics(&slo, deps[i])
	}
	for i, f := range families {
		fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s %s\n", f[0], f[2], f[0], f[1])
		b.WriteString(fam[i].String())
	}
	fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s %s\n", sloFamily[0], sloFamily[2], sloFamily[0], sloFamily[1])
	b.WriteString(slo.String())
}

// WriteReadiness writes one /readyz?verbose line per deployment with flow
// control: what it holds by class, and whether its pool is saturated.
func (s *Set) WriteReadiness(b *strings.Builder) {
	deps, ctrls := s.sorted()
	for i, c := range ctrls {
		c.mu.Lock()
		fmt.Fprintf(b, "flow %s: %d held (", deps[i], c.queued)
		for j := range c.classes {
			if j > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(b, "%s %d", c.cfg.Classes[j].Name, c.classes[j].n)
		}
		state := "room"
		if c.room(len(c.classes)-1) <= 0 {
			state = "saturated"
		}
		c.mu.Unlock()
		fmt.Fprintf(b, "), %s\n", state)
		c.writeSLOReadiness(b, deps[i])
	}
}
