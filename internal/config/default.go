package config

import _ "embed"

// DefaultConfigYAML is the embedded default used when no --config is given.
//
//go:embed default_config.yaml
var DefaultConfigYAML []byte
