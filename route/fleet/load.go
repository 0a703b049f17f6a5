package fleet

// Contains reports whether e is already in dst (dst is tiny).
func Contains(dst []*Endpoint, e *Endpoint) bool {
	for _, d := range dst {
		if d == e {
			return true
		}
	}
	return false
}

// FillLeastLoaded appends the least-loaded available endpoints not yet in
// dst until dst is full; ties go to the fewest decisions since the last
// scrape, then to the earliest after a random rotation so equal loads spread.
func FillLeastLoaded(dst []*Endpoint, p *Pool, rnd *Rand) []*Endpoint {
	n := len(p.Endpoints)
	if n == 0 {
		return dst
	}
	off := 0
	if rnd != nil {
		off = rnd.Intn(n)
	}
	for len(dst) < cap(dst) {
		var best *Endpoint
		var bestLoad int64
		var bestRecent uint64
		for i := 0; i < n; i++ {
			e := p.Endpoints[(i+off)%n]
			if !e.Available() || Contains(dst, e) {
				continue
			}
			l := e.Load()
			if best != nil && l > bestLoad {
				continue
			}
			if r := e.Recent(); best == nil || l < bestLoad || r < bestRecent {
				best, bestLoad, bestRecent = e, l, r
			}
		}
		if best == nil {
			return dst
		}
		dst = append(dst, best)
	}
	return dst
}

// LowestLoad is the lowest Load among available endpoints; ok is false when
// none is available.
func LowestLoad(p *Pool) (minLoad int64, ok bool) {
	for _, e := range p.Endpoints {
		if e.Available() {
			if l := e.Load(); !ok || l < minLoad {
				minLoad, ok = l, true
			}
		}
	}
	return minLoad, ok
}

// LoadSummary is the lowest Load and the summed recent decisions over the n
// available endpoints (n == 0: none available), in one pass.
func LoadSummary(p *Pool, withServed bool) (minLoad int64, served uint64, n int) {
	for _, e := range p.Endpoints {
		if e.Available() {
			l := e.Load()
			if n == 0 || l < minLoad {
				minLoad = l
			}
			if withServed { // only the bounded-load guard reads it
				served += e.Served()
			}
			n++
		}
	}
	return minLoad, served, n
}

// TooLoaded is SGLang's imbalance test applied to one candidate: it is more
// than abs requests above the least loaded and more than rel times it.
func TooLoaded(load, minLoad, abs int64, rel float64) bool {
	return load-minLoad > abs && float64(load) > rel*float64(minLoad)
}

// EngineRequests is the engine's running + waiting count at the last
// scrape; ok is false when none is known.
func (st *State) EngineRequests() (n int64, ok bool) {
	if el := st.engine.Load(); el != nil {
		return el.Requests, true
	}
	return 0, false
}

// Unmark keeps Load unchanged when n decisions the engine no longer counts
// are closed without a completion (route's ledger reconciliation): the
// in-flight count falls by n, and so does the last scrape's mark.
func (st *State) Unmark(n int64) {
	for {
		el := st.engine.Load()
		if el == nil {
			return
		}
		nl := *el
		nl.Mark -= n
		if st.engine.CompareAndSwap(el, &nl) {
			return
		}
	}
}
