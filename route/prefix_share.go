package route

// PrefixRecorder is implemented by policies whose approximate prefix index
// can learn what another turnout instance routed (cluster sync). kv-aware
// does not implement it: every instance reads the engines' own events.
type PrefixRecorder interface {
	// RecordPrefix marks blocks as sent to the endpoint at index i.
	RecordPrefix(i int, blocks []uint64)
}

// PrefixSink receives every prefix decision of a PrefixRecorder pool, on the
// hot path: it must not block or allocate, and must not keep blocks (a view
// into per-request scratch memory).
type PrefixSink interface {
	RoutedPrefix(p *Pool, e *Endpoint, blocks []uint64)
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
func (s *Server) sharePrefix(p *Pool, e *Endpoint, blocks []uint64) {
	if len(blocks) == 0 || !p.records {
		return
	}
	if b := s.sink.Load(); b != nil {
		b.RoutedPrefix(p, e, blocks)
	}
}

// RecordPrefix implements PrefixRecorder.
func (pa *PrefixAffinity) RecordPrefix(i int, blocks []uint64) {
	if i >= 0 && i < len(pa.lrus) {
		pa.lrus[i].insert(blocks)
	}
}

// PoolByName returns the snapshot's pool with that name, or nil.
func (s *Snapshot) PoolByName(name string) *Pool {
	for _, d := range s.Deployments {
		for _, p := range d.Pools {
			if p.Name == name {
				return p
			}
		}
	}
	return nil
}

// EndpointByName returns the pool's endpoint with that name, or nil.
func (p *Pool) EndpointByName(name []byte) *Endpoint {
	for _, e := range p.Endpoints {
		if string(e.name) == string(name) {
			return e
		}
	}
	return nil
}

var _ PrefixRecorder = (*PrefixAffinity)(nil)
