package contract

import (
	"regexp"
	"testing"

	"github.com/turnout/turnout/internal/config"
)

// The glue refuses vLLM's adapter admin routes, and nothing else under
// /v1/, unless the config exposes them.
func TestAdminPathRefused(t *testing.T) {
	re := regexp.MustCompile("(?i)" + AdminPathRegex)
	for _, p := range []string{"/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/v1/load_lora_adapter?a=b", "/v1/Unload_LoRA_Adapter/"} {
		if !re.MatchString(p) {
			t.Errorf("%s is not refused", p)
		}
	}
	for _, p := range []string{"/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/load_lora_adapters", "/x/v1/load_lora_adapter"} {
		if re.MatchString(p) {
			t.Errorf("%s is refused", p)
		}
	}
	var cfg config.Config
	if AdminPathRefused(&cfg) != AdminPathRegex {
		t.Error("the admin routes are exposed by default")
	}
	cfg.Proxy.ExposeAdminPaths = true
	if AdminPathRefused(&cfg) != "" {
		t.Error("proxy.expose_admin_paths does not expose them")
	}
}
