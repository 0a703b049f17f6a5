package kube

import (
	"os"
	"testing"

	"github.com/turnout/turnout/internal/config"

	"gopkg.in/yaml.v3"
)

// The sample config in deploy/kubernetes/turnout.yaml is accepted as is,
// label selectors included, and warns about nothing.
func TestDeployConfigMap(t *testing.T) {
	b, err := os.ReadFile("../../../deploy/kubernetes/turnout.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cm struct {
		Kind string            `yaml:"kind"`
		Data map[string]string `yaml:"data"`
	}
	if err := yaml.Unmarshal(b, &cm); err != nil || cm.Kind != "ConfigMap" || cm.Data["turnout.yaml"] == "" {
		t.Fatalf("first document is not the ConfigMap with turnout.yaml: %v %+v", err, cm)
	}
	cfg, err := config.ParseConfig([]byte(cm.Data["turnout.yaml"]))
	if err != nil {
		t.Fatal(err)
	}
	if err := Check(cfg); err != nil {
		t.Fatal(err)
	}
	if !cfg.HasDiscovery() {
		t.Error("the sample config discovers nothing")
	}
	for _, w := range cfg.Warnings() {
		t.Errorf("warning: %v", w)
	}
}
