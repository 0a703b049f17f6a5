package health

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// The background half of the model-name check (modelverify.go refuses at
// load what answering replicas lack): replicas that were not up at load,
// discovered ones and replicas serving none of a deployment's names are
// asked here (GET /v1/models), and each name a replica would answer 404 for
// is logged with the vLLM flag that fixes it and counted in
// turnout_endpoint_model_missing. Never on the decision path.

// modelCheck remembers, per endpoint and model list, what was found.
type modelCheck struct {
	mu      sync.Mutex
	checked map[string]bool     // endpoint|address|models -> answered
	missing map[string][]string // endpoint -> missing names (sorted)
}

// ServedModelsPath is where replicas list the model names they accept.
const ServedModelsPath = "/v1/models"

// CheckServedModels checks every endpoint once per config (retrying those
// that did not answer every interval) until ctx ends.
func (c *Checker) CheckServedModels(ctx context.Context, interval time.Duration) {
	mc := &modelCheck{checked: map[string]bool{}, missing: map[string][]string{}}
	c.d.AddMetrics(mc.writeMetrics)
	client := &http.Client{Timeout: 3 * time.Second}
	for {
		c.checkModelsOnce(ctx, client, mc)
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}

func (c *Checker) checkModelsOnce(ctx context.Context, client *http.Client, mc *modelCheck) {
	snap := c.d.Snapshot()
	for _, d := range snap.Deployments {
		want := d.Config.Models
		for _, p := range d.Pools {
			for _, e := range p.Endpoints {
				key := e.Name + "|" + e.Address + "|" + strings.Join(want, ",")
				mc.mu.Lock()
				done := mc.checked[key]
				mc.mu.Unlock()
				if done {
					continue
				}
				served, err := fetchServedModels(ctx, client, e.Address)
				if err != nil {
					c.log.Debug().Err(err).Str("endpoint", e.Name).Msg("served models: no answer yet")
					continue
				}
				var miss []string
				for _, m := range want {
					if !slices.Contains(served, m) {
						miss = append(miss, m)
					}
				}
				sort.Strings(miss)
				mc.mu.Lock()
				mc.checked[key] = true
				mc.missing[e.Name] = miss
				mc.mu.Unlock()
				if len(miss) > 0 {
					c.log.Warn().Str("endpoint", e.Name).Str("address", e.Address).Strs("missing", miss).Strs("serves", served).
						Msgf("endpoint %s does not serve %s: requests with that model routed to it will get 404; start vLLM with --served-model-name %s (or drop the alias from deployment %s's models)",
							e.Name, quoteAll(miss), strings.Join(want, " "), d.Name)
				}
			}
		}
	}
}

// fetchServedModels returns the ids of GET http://addr/v1/models.
func fetchServedModels(ctx context.Context, client *http.Client, addr string) ([]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+ServedModelsPath, nil)
	if err != nil {
		return nil, fmt.Errorf("served models: %w", err)
	}
	res, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("served models: %w", err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("served models: %s answered %d", addr, res.StatusCode)
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(res.Body, 1<<20)).Decode(&list); err != nil {
		return nil, fmt.Errorf("served models: %s: %w", addr, err)
	}
	out := make([]string, 0, len(list.Data))
	for _, m := range list.Data {
		out = append(out, m.ID)
	}
	return out, nil
}

func (mc *modelCheck) writeMetrics(b *strings.Builder) {
	mc.mu.Lock()
	defer mc.mu.Unlock()
	b.WriteString("# HELP turnout_endpoint_model_missing 1 for each model name a deployment accepts that the endpoint does not serve (GET /v1/models): requests with it routed there get 404.\n# TYPE turnout_endpoint_model_missing gauge\n")
	names := make([]string, 0, len(mc.missing))
	for n := range mc.missing {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		for _, m := range mc.missing[n] {
			fmt.Fprintf(b, "turnout_endpoint_model_missing{endpoint=%q,model=%q} 1\n", n, m)
		}
	}
}

func quoteAll(s []string) string {
	q := make([]string, len(s))
	for i, v := range s {
		q[i] = fmt.Sprintf("%q", v)
	}
	return strings.Join(q, ", ")
}
