package httpapi

import (
	"fmt"
	"testing"

	"github.com/turnout/turnout/route/fleet"
)

// A request for a LoRA adapter that some endpoints serve (a model mask,
// the adapter hash, lora-affinity's scorer and recorder) allocates nothing
// either, under every policy; a base-model request beside it too
// (lora-affinity with prefix_weight routes it by prefix).
func TestAdapterDecisionAllocs(t *testing.T) {
	for _, pol := range []string{"least-request", "session-hash", "prefix-affinity", "round-robin", "lora-affinity", "lora-affinity, params: {prefix_weight: 16}"} {
		t.Run(pol, func(t *testing.T) {
			s := mustServer(t, fmt.Sprintf(fourEndpoints, pol))
			for i, name := range []string{"a", "b", "c", "d"} {
				list := []fleet.ServedModel{{ID: "llama"}, {ID: "meta-llama/Llama-3.1-8B-Instruct"}}
				if i%2 == 0 {
					list = append(list, fleet.ServedModel{ID: "sql", Parent: "llama"})
				}
				s.Snapshot().EndpointByServer([]byte(name)).SetServed(&fleet.ServedModels{Models: list, Source: fleet.ModelsListed})
			}
			s.RefreshModels()
			assertZeroAllocs(t, s, routeCtx(`{"model":"sql","messages":[{"role":"user","content":"`+fmt.Sprint(pol)+` hello"}]}`, "user-1"))
			assertZeroAllocs(t, s, routeCtx(`{"model":"llama","messages":[{"role":"user","content":"`+fmt.Sprint(pol)+` hello"}]}`, "user-1"))
		})
	}
}
