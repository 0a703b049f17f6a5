package config

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	didyoumean "github.com/turnout/turnout/internal/suggest"
)

// Config errors name the field path and the line of the file, in words an
// operator can act on (no Go type names). The file is decoded from a
// yaml.Node walk instead of yaml.v3's Decoder because the Decoder drops
// positions in two places: strict decoding of a sub-node (policy params) has
// no KnownFields, and re-marshalling a node renumbers it from line 1.

// FieldError is one problem in a config: where (path, line) and what.
type FieldError struct {
	Path string // e.g. deployments[0].pools[1].endpoints[2].address
	Line int    // 1-based line in the file; 0 when the field is not in the file (a default)
	Msg  string
}

func (e *FieldError) Error() string {
	var b strings.Builder
	if e.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Is makes errors.Is(err, ErrConfig) hold for every config problem.
func (e *FieldError) Is(target error) bool { return target == ErrConfig }

// ConfigError is every problem found in one config (or one policy's params).
type ConfigError struct {
	File     string // "" for a config that is not a file (embedded default, tests)
	Problems []*FieldError
}

func (e *ConfigError) Error() string {
	var b strings.Builder
	b.WriteString("invalid config")
	if e.File != "" {
		b.WriteString(" ")
		b.WriteString(e.File)
	}
	if len(e.Problems) == 1 {
		b.WriteString(": ")
		b.WriteString(e.Problems[0].Error())
		return b.String()
	}
	fmt.Fprintf(&b, " (%d problems):", len(e.Problems))
	for _, p := range e.Problems {
		b.WriteString("\n  ")
		b.WriteString(p.Error())
	}
	return b.String()
}

// Is makes errors.Is(err, ErrConfig) hold.
func (e *ConfigError) Is(target error) bool { return target == ErrConfig }

// AsError turns Validate-style errors into one ConfigError, keeping
// FieldErrors and wrapping anything else; nil when errs is empty.
func AsError(errs []error) *ConfigError {
	if len(errs) == 0 {
		return nil
	}
	ce := &ConfigError{}
	for _, err := range errs {
		var fe *FieldError
		var inner *ConfigError
		switch {
		case errors.As(err, &inner):
			ce.Problems = append(ce.Problems, inner.Problems...)
		case errors.As(err, &fe):
			ce.Problems = append(ce.Problems, fe)
		default:
			ce.Problems = append(ce.Problems, &FieldError{Msg: strings.TrimPrefix(err.Error(), ErrConfig.Error()+": ")})
		}
	}
	return ce
}

// positions maps field paths to the line they start on in the file.
type positions map[string]int

// lineOf is the line of path, else of its closest ancestor in the file.
func (p positions) lineOf(path string) int {
	for path != "" {
		if l, ok := p[path]; ok {
			return l
		}
		i := strings.LastIndexAny(path, ".[")
		if i < 0 {
			break
		}
		path = path[:i]
	}
	return 0
}

// annotate fills in the lines of problems Validate found by path.
func (p positions) annotate(ce *ConfigError) {
	if ce == nil {
		return
	}
	for _, pr := range ce.Problems {
		if pr.Line == 0 && pr.Path != "" {
			pr.Line = p.lineOf(pr.Path)
		}
	}
	sort.SliceStable(ce.Problems, func(i, j int) bool { return ce.Problems[i].Line < ce.Problems[j].Line })
}

// decodeConfigYAML decodes b into c strictly, returning the field positions
// for later problems and a ConfigError for syntax, unknown fields and values
// of the wrong kind.
func decodeConfigYAML(b []byte, c *Config) (positions, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, &ConfigError{Problems: []*FieldError{syntaxError(b, err)}}
	}
	if doc.Kind == 0 || len(doc.Content) == 0 || doc.Content[0].Kind == yaml.ScalarNode && doc.Content[0].Tag == "!!null" {
		return nil, &ConfigError{Problems: []*FieldError{{Msg: "the file is empty; a config needs at least a deployments list (see docs/configuration.md)"}}}
	}
	d := nodeDecoder{pos: positions{}}
	d.decode(doc.Content[0], reflect.ValueOf(c).Elem(), "")
	if len(d.errs) > 0 {
		return d.pos, &ConfigError{Problems: d.errs}
	}
	return d.pos, nil
}

// syntaxError locates a YAML syntax error. yaml.v3 reports the line where
// the enclosing block began (its context mark), often lines above the
// mistake; the first line at which the file stops parsing is where an
// operator has to look, so it is found by parsing growing prefixes (only on
// this error path, on a small file).
func syntaxError(b []byte, err error) *FieldError {
	msg := err.Error()
	msg = strings.TrimPrefix(msg, "yaml: ")
	if i := strings.Index(msg, ": "); strings.HasPrefix(msg, "line ") && i > 0 {
		msg = msg[i+2:]
	}
	lines := bytes.SplitAfter(b, []byte("\n"))
	end := 0
	for i, l := range lines {
		end += len(l)
		var n yaml.Node
		if yaml.Unmarshal(b[:end], &n) != nil {
			return &FieldError{Line: i + 1, Msg: "YAML syntax: " + msg + " (check the indentation and brackets on this line or just above it)"}
		}
	}
	return &FieldError{Msg: "YAML syntax: " + err.Error()}
}

// nodeDecoder walks a yaml.Node tree into a Go value, strictly.
type nodeDecoder struct {
	pos  positions
	errs []*FieldError
}

func (d *nodeDecoder) fail(n *yaml.Node, path, format string, a ...any) {
	d.errs = append(d.errs, &FieldError{Path: path, Line: n.Line, Msg: fmt.Sprintf(format, a...)})
}

// positioned is implemented by config parts that keep where they came from
// (policies, whose params are decoded later by the policy factory).
type positioned interface{ setPosition(path string, line int) }

var (
	nodeType        = reflect.TypeOf(yaml.Node{})
	unmarshalerType = reflect.TypeOf((*yaml.Unmarshaler)(nil)).Elem()
	positionedType  = reflect.TypeOf((*positioned)(nil)).Elem()
)

func (d *nodeDecoder) decode(n *yaml.Node, v reflect.Value, path string) {
	for n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if _, ok := d.pos[path]; !ok {
		d.pos[path] = n.Line
	}
	t := v.Type()
	if reflect.PointerTo(t).Implements(positionedType) {
		v.Addr().Interface().(positioned).setPosition(path, n.Line)
	}
	if t == nodeType {
		v.Set(reflect.ValueOf(*n))
		return
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return // "key:" with nothing after it keeps the default
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) {
		if err := n.Decode(v.Addr().Interface()); err != nil {
			d.fail(n, path, "%s", cleanYAMLError(err))
		}
		return
	}
	switch t.Kind() {
	case reflect.Pointer:
		nv := reflect.New(t.Elem())
		d.decode(n, nv.Elem(), path)
		v.Set(nv)
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			d.fail(n, path, "want a mapping (key: value lines or {key: value}), got %s", describe(n))
			return
		}
		fields := yamlFields(t)
		seen := map[string]int{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			fp := joinPath(path, k.Value)
			if l, dup := seen[k.Value]; dup {
				d.fail(k, fp, "set twice (first on line %d)", l)
				continue
			}
			seen[k.Value] = k.Line
			idx, ok := fields.index[k.Value]
			if !ok {
				if len(fields.names) == 0 {
					d.fail(k, fp, "unknown field %q (%s takes no fields)", k.Value, path)
					continue
				}
				d.fail(k, fp, "unknown field %q%s (known: %s)", k.Value, suggest(k.Value, fields.names), strings.Join(fields.names, ", "))
				continue
			}
			d.pos[fp] = k.Line
			d.decode(val, v.FieldByIndex(idx), fp)
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			d.fail(n, path, "want a list ([a, b] or lines starting with '- '), got %s", describe(n))
			return
		}
		s := reflect.MakeSlice(t, len(n.Content), len(n.Content))
		for i, e := range n.Content {
			d.decode(e, s.Index(i), fmt.Sprintf("%s[%d]", path, i))
		}
		v.Set(s)
	case reflect.String, reflect.Bool, reflect.Int, reflect.Int64, reflect.Int32, reflect.Uint, reflect.Uint64, reflect.Uint32, reflect.Float64, reflect.Float32:
		if n.Kind != yaml.ScalarNode {
			d.fail(n, path, "want %s, got %s", kindWord(t.Kind()), describe(n))
			return
		}
		if err := n.Decode(v.Addr().Interface()); err != nil {
			d.fail(n, path, "want %s, got %q", kindWord(t.Kind()), n.Value)
		}
	default:
		if err := n.Decode(v.Addr().Interface()); err != nil {
			d.fail(n, path, "%s", cleanYAMLError(err))
		}
	}
}

type fieldSet struct {
	index map[string][]int // reflect.Value.FieldByIndex paths
	names []string
}

// yamlFields maps a struct's yaml keys to field index paths (exported
// fields with a yaml tag; "-" skipped; a struct tagged ",inline" lends its
// keys, as yaml.v3 does, so a policy can take another's params as its own).
func yamlFields(t reflect.Type) fieldSet {
	fs := fieldSet{index: map[string][]int{}}
	addFields(&fs, t, nil)
	return fs
}

func addFields(fs *fieldSet, t reflect.Type, at []int) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" {
			continue
		}
		idx := append(append([]int(nil), at...), i)
		if name == "" && opts == "inline" && f.Type.Kind() == reflect.Struct {
			addFields(fs, f.Type, idx)
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		fs.index[name] = idx
		fs.names = append(fs.names, name)
	}
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	default:
		return strconv.Quote(n.Value)
	}
}

func kindWord(k reflect.Kind) string {
	switch k {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Uint, reflect.Uint32, reflect.Uint64:
		return "a non-negative integer"
	default:
		return "an integer"
	}
}

// cleanYAMLError strips yaml.v3's "yaml: unmarshal errors:\n  line N:"
// framing (the caller adds path and line).
func cleanYAMLError(err error) string {
	var te *yaml.TypeError
	if errors.As(err, &te) && len(te.Errors) > 0 {
		err = errors.New(te.Errors[0])
	}
	msg := err.Error()
	if strings.HasPrefix(msg, "line ") {
		if i := strings.Index(msg, ": "); i > 0 {
			msg = msg[i+2:]
		}
	}
	return msg
}

// suggest offers the known field nearest to a misspelt one.
func suggest(got string, names []string) string {
	if best := didyoumean.Nearest(got, names); best != "" {
		return fmt.Sprintf("; did you mean %q?", best)
	}
	return ""
}

// durationHelp is the accepted duration syntax, for error messages.
const durationHelp = "a duration such as 500ms, 2s or 10m (the unit is required)"
