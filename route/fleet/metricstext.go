package fleet

import (
	"fmt"
	"strings"
)

// WriteEndpointSeries writes one series of family name per endpoint of
// pools, labelled by deployment, pool and endpoint, valued v(endpoint).
func WriteEndpointSeries(b *strings.Builder, pools []*Pool, name string, v func(*Endpoint) float64) {
	for _, p := range pools {
		for _, e := range p.Endpoints {
			fmt.Fprintf(b, "%s{deployment=%q,pool=%q,endpoint=%q} %g\n", name, p.Deployment, p.Name, e.Name, v(e))
		}
	}
}

// Flag is 1 for true, 0 for false: a 0/1 gauge's value.
func Flag(on bool) float64 {
	if on {
		return 1
	}
	return 0
}
