// Package models maps every model name a request may carry, base model or
// LoRA adapter, to its deployment and to the endpoints of each of the
// deployment's pools that serve it, from what each endpoint was last known
// to serve (fleet.ServedModels: pinned in the config, from pod labels or
// GET /v1/models; fleet.LoRAState: the engine's running adapters). A Table
// is built off the decision path whenever that knowledge changes; a
// decision reads it with one map lookup.
package models
