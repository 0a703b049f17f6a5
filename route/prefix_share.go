package route

import "github.com/turnout/turnout/route/fleet"

// PrefixSink receives every prefix decision of a PrefixRecorder pool, on the
// hot path: it must not block or allocate, and must not keep blocks (a view
// into per-request scratch memory).
type PrefixSink interface {
	RoutedPrefix(p *fleet.Pool, e *fleet.Endpoint, blocks []uint64)
}

// sinkBox lets an interface live in an atomic.Pointer.
type sinkBox struct{ PrefixSink }

// SetPrefixSink installs (or, with nil, removes) the prefix decision sink.
func (s *Server) SetPrefixSink(ps PrefixSink) {
	if ps == nil {
		s.sink.Store(nil)
		return
	}
	s.sink.Store(&sinkBox{ps})
}

// sharePrefix hands a decision to the sink, if any.
func (s *Server) sharePrefix(p *fleet.Pool, e *fleet.Endpoint, blocks []uint64) {
	if len(blocks) == 0 || !p.Records {
		return
	}
	if b := s.sink.Load(); b != nil {
		b.RoutedPrefix(p, e, blocks)
	}
}

// PoolByName returns the snapshot's pool with that name, or nil.
func (s *Snapshot) PoolByName(name string) *fleet.Pool {
	for _, d := range s.Deployments {
		for _, p := range d.Pools {
			if p.Name == name {
				return p
			}
		}
	}
	return nil
}
