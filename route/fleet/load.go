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
		nl.Missing, nl.Ghosts = max(0, nl.Missing-n), max(0, nl.Ghosts-n)
		if st.engine.CompareAndSwap(el, &nl) {
			return
		}
	}
}
