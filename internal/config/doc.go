// Package config is turnout's configuration: the YAML schema (Config and
// its parts), defaults, validation and the one name validator every proxy
// name goes through, with errors that give the field path and the file line.
// It knows nothing of routing: policy parameters stay a yaml.Node here and
// are decoded by their policy (route), through PolicyConfig.DecodeParams.
package config
