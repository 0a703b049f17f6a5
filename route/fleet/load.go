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
