// Package kvtopic is the grammar of a KV-events topic template: how the
// config names the topic each endpoint's engine publishes on, and how a
// template rendered for one endpoint matches the topics that arrive. The
// config validates templates with it and route/kv attributes messages with
// it, so it sits below both.
package kvtopic

import (
	"bytes"
	"fmt"
	"net"
	"strings"
)

// DefaultTemplate is llm-d's convention for vLLM's kv-events topic.
const DefaultTemplate = "kv@{host}:{port}@{model}"

// Pattern is a topic template rendered for one endpoint. Placeholders:
// {name} (endpoint name), {address} (its host:port), {host}, {port}, and at
// most one {model}, which matches any text: engines publish their served
// model name, which need not be one of turnout's model names.
type Pattern struct {
	prefix, suffix string
	wild           bool
}

// Compile renders tmpl for the endpoint name at address (host:port).
func Compile(tmpl, name, address string) (Pattern, error) {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return Pattern{}, fmt.Errorf("kv: topic for %q: address %q: %w", name, address, err)
	}
	r := strings.NewReplacer("{name}", name, "{address}", address, "{host}", host, "{port}", port)
	before, after, wild := strings.Cut(tmpl, "{model}")
	if wild && strings.Contains(after, "{model}") {
		return Pattern{}, fmt.Errorf("kv: topic template %q: {model} may appear once", tmpl)
	}
	p := Pattern{prefix: r.Replace(before), suffix: r.Replace(after), wild: wild}
	for _, s := range []string{p.prefix, p.suffix} {
		if i := strings.IndexByte(s, '{'); i >= 0 && strings.IndexByte(s[i:], '}') > 0 {
			return Pattern{}, fmt.Errorf("kv: topic template %q: unknown placeholder (want {name}, {address}, {host}, {port}, {model})", tmpl)
		}
	}
	return p, nil
}

// Validate checks a template without an endpoint.
func Validate(tmpl string) error {
	_, err := Compile(tmpl, "x", "h:1")
	return err
}

// Match reports whether topic belongs to this pattern's endpoint.
func (p Pattern) Match(topic []byte) bool {
	if !p.wild {
		return string(topic) == p.prefix
	}
	return len(topic) >= len(p.prefix)+len(p.suffix) &&
		bytes.HasPrefix(topic, []byte(p.prefix)) && bytes.HasSuffix(topic, []byte(p.suffix))
}

// Weight orders overlapping patterns: the most specific wins.
func (p Pattern) Weight() int { return len(p.prefix) + len(p.suffix) }

func (p Pattern) String() string {
	if p.wild {
		return p.prefix + "{model}" + p.suffix
	}
	return p.prefix
}
