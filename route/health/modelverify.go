package health

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/turnout/turnout/internal/config"
)

// A name no replica serves is refused at load. turnout forwards the request
// body unchanged: it does not rewrite "model", because that would cost the
// proxy a body copy on every request and cannot be done at all in nginx
// header mode (auth_request never sees the body). Replicas of one
// deployment may serve different names (one serves alpha, another beta):
// requests for each go to the endpoints that serve it (the model table),
// so that is not refused. What is refused is a name in a deployment's
// models: that none of its answering replicas serves although they serve
// another of its names: every request for it would get 404.
// VerifyServedModels asks every static endpoint that answers (GET
// /v1/models). A replica that does not answer in time cannot be checked
// here; the background check (modelcheck.go) warns about it later, as it
// does for discovered endpoints, which are not known at load.
//
// A replica serving none of the deployment's names is either the wrong
// replica or a permissive server (the mock without --strict-models accepts
// every name); the background check warns about it instead of refusing the
// config.

// ServedModelsTimeout bounds the whole load-time check: a config load never
// waits longer than this on replicas.
const ServedModelsTimeout = 2 * time.Second

// VerifyServedModels returns a *ConfigError naming every deployments[i].models[j]
// that no answering static endpoint of the deployment serves although they
// serve another of its names; nil when there is none or nobody answered.
func VerifyServedModels(ctx context.Context, cfg *config.Config, client *http.Client) error {
	ctx, cancel := context.WithTimeout(ctx, ServedModelsTimeout)
	defer cancel()
	if client == nil {
		client = &http.Client{Timeout: ServedModelsTimeout}
	}
	type target struct{ dep, pool, ep int }
	byAddr := map[string][]target{}
	var addrs []string
	for i := range cfg.Deployments {
		for j := range cfg.Deployments[i].Pools {
			for k, e := range cfg.Deployments[i].Pools[j].Endpoints {
				if _, ok := byAddr[e.Address]; !ok {
					addrs = append(addrs, e.Address)
				}
				byAddr[e.Address] = append(byAddr[e.Address], target{i, j, k})
			}
		}
	}
	served := make([][]string, len(addrs)) // nil: no answer
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for n, addr := range addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			if list, err := fetchServedModels(ctx, client, addr); err == nil {
				served[n] = list
			}
		}()
	}
	wg.Wait()

	// One problem per name that no answering replica of its deployment
	// serves, naming the replicas that lack it.
	type key struct{ dep, model int }
	missing := map[key][]string{}
	servedBy := map[key]bool{}
	var order []key
	example := map[key][]string{} // what one of those replicas serves
	for n, addr := range addrs {
		list := served[n]
		if list == nil {
			continue
		}
		for _, t := range byAddr[addr] {
			d := &cfg.Deployments[t.dep]
			if !slices.ContainsFunc(d.Models, func(m string) bool { return slices.Contains(list, m) }) {
				continue // serves none: warned about in the background
			}
			for m, name := range d.Models {
				k := key{t.dep, m}
				if slices.Contains(list, name) {
					servedBy[k] = true
					continue
				}
				if _, ok := missing[k]; !ok {
					order = append(order, k)
					example[k] = list
				}
				missing[k] = append(missing[k], d.Pools[t.pool].Endpoints[t.ep].Name+" ("+addr+")")
			}
		}
	}
	var problems []*config.FieldError
	for _, k := range order {
		if servedBy[k] {
			continue // routed to the replicas that serve it
		}
		d := &cfg.Deployments[k.dep]
		name := d.Models[k.model]
		path := fmt.Sprintf("deployments[%d].models[%d]", k.dep, k.model)
		problems = append(problems, &config.FieldError{Path: path, Line: cfg.Line(path), Msg: fmt.Sprintf(
			"%q is not served by any replica of deployment %s (%s serve%s %s): turnout forwards the body unchanged (it does not rewrite \"model\"), so every request for %q would get 404; "+
				"if %q is a different model, give it its own deployment with replicas that serve it; if it is another name for the model these replicas run, add it to their --served-model-name; or remove %q from models",
			name, d.Name, strings.Join(missing[k], ", "), plural(len(missing[k])), quoteAll(example[k]), name, name, name)})
	}
	if len(problems) == 0 {
		return nil
	}
	sort.SliceStable(problems, func(i, j int) bool { return problems[i].Line < problems[j].Line })
	return &config.ConfigError{Problems: problems}
}

// plural is the verb ending for n subjects ("serves" for one).
func plural(n int) string {
	if n == 1 {
		return "s"
	}
	return ""
}
