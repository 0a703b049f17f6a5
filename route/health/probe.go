package health

import (
	"context"
	"fmt"
	"net/http"
	"sync"

	"github.com/turnout/turnout/internal/config"
)

// Probe is what one static endpoint answered to GET /v1/models.
type Probe struct {
	Path    string // deployments[i].pools[j].endpoints[k]
	Name    string
	Address string
	Models  []string // served model ids when Err is nil
	Err     error    // unreachable or not an OpenAI models answer
}

// ProbeEndpoints asks every static endpoint of cfg for its served models
// (turnout check), at most 32 at a time, each bounded by client's timeout
// (ServedModelsTimeout when client is nil). Results are in config order.
func ProbeEndpoints(ctx context.Context, cfg *config.Config, client *http.Client) []Probe {
	if client == nil {
		client = &http.Client{Timeout: ServedModelsTimeout}
	}
	var out []Probe
	for i := range cfg.Deployments {
		for j := range cfg.Deployments[i].Pools {
			for k, e := range cfg.Deployments[i].Pools[j].Endpoints {
				out = append(out, Probe{Path: fmt.Sprintf("deployments[%d].pools[%d].endpoints[%d]", i, j, k), Name: e.Name, Address: e.Address})
			}
		}
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for n := range out {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			out[n].Models, out[n].Err = fetchServedModels(ctx, client, out[n].Address)
		}()
	}
	wg.Wait()
	return out
}
