package config

// orDefault sets *p to v when the config leaves it out (its zero value).
func orDefault[T comparable](p *T, v T) {
	var zero T
	if *p == zero {
		*p = v
	}
}
