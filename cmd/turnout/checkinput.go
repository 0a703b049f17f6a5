package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"gopkg.in/yaml.v3"
)

// stdinConfig is the name `turnout check -` (or --config -) reads from.
const stdinConfig = "-"

// configMapKey is the key of turnout's config in the chart's ConfigMap.
const configMapKey = "turnout.yaml"

// manifestObject is the part of a Kubernetes object checkInput looks at.
type manifestObject struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Data map[string]string `yaml:"data"`
}

// checkInput reads the config check was given on stdin: a turnout config
// as it is, or Kubernetes manifests (`helm template ... |`), of which the
// ConfigMap holding turnout.yaml is taken. name says where the config came
// from, for the problems' file field (their lines count from the first
// line of that config).
func checkInput(r io.Reader) (cfg []byte, name string, err error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, "", fmt.Errorf("check: read stdin: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var found []manifestObject
	manifests := false
	for {
		var o manifestObject
		if err := dec.Decode(&o); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			// Not manifests (or not YAML): the config parser says what is wrong.
			return b, "(stdin)", nil
		}
		if o.Kind == "" {
			continue
		}
		manifests = true
		if _, ok := o.Data[configMapKey]; o.Kind == "ConfigMap" && ok {
			found = append(found, o)
		}
	}
	if !manifests {
		return b, "(stdin)", nil
	}
	switch len(found) {
	case 0:
		return nil, "", fmt.Errorf("check: stdin holds Kubernetes objects but no ConfigMap with a %s key (the chart's ConfigMap: helm template ... --show-only templates/configmap.yaml)", configMapKey)
	case 1:
		return []byte(found[0].Data[configMapKey]), fmt.Sprintf("(stdin) ConfigMap %s, %s", found[0].Metadata.Name, configMapKey), nil
	default:
		return nil, "", fmt.Errorf("check: stdin holds %d ConfigMaps with a %s key (%s, %s, ...): check one release at a time", len(found), configMapKey, found[0].Metadata.Name, found[1].Metadata.Name)
	}
}
