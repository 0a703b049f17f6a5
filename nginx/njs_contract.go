package nginx

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"text/template"

	"github.com/turnout/turnout/internal/proxyconf"
	"github.com/turnout/turnout/route/contract"
)

// jsContract is the glue contract of route/contract/glue.go as JavaScript
// literals (JSON), rendered into the data section of
// templates/nginx-turnout.js. It does not depend on the config, so the
// module is rendered once per Renderer.
type jsContract struct {
	VerdictVars, Required, Reason, Edit string
	RetryAfter                          string
	ReasonActions, RelayStatuses        string
	BadAnswer, FailClosed               string
}

func jsLit(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // static data: a bug, caught by every render test
	}
	return string(b)
}

func newJSContract() jsContract {
	var c jsContract
	g := contract.GlueVerdict()
	c.Required, c.Reason = jsLit(g.Required.Header), jsLit(g.Reason.Header)
	c.RetryAfter = jsLit(g.RetryAfter.Header)
	edit := map[string]string{"insert": g.EditInsert.Header, "at": g.EditAt.Header}
	var vars [][2]string
	for _, f := range g.Copied {
		if f.NginxVar != "" {
			vars = append(vars, [2]string{f.Header, f.NginxVar})
		}
	}
	c.VerdictVars, c.Edit = jsLit(vars), jsLit(edit)
	actions := map[string]contract.GlueAction{}
	for _, r := range contract.ReasonRules() {
		actions[r.Reason] = r.Action
	}
	c.ReasonActions = jsLit(actions)
	c.RelayStatuses = jsLit(contract.RelayStatuses())
	c.BadAnswer = jsLit(contract.BadAnswerReason)
	fc := contract.FailClosedError
	c.FailClosed = jsLit(map[string]any{"status": fc.Status, "type": fc.Type, "message": fc.Message})
	return c
}

// renderJS renders the njs module from fsys's template.
func renderJS(fsys fs.FS) ([]byte, error) {
	src, err := fs.ReadFile(proxyconf.Assets(fsys), jsTemplate)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", jsTemplate, err)
	}
	t, err := template.New(JSFile).Option("missingkey=error").Parse(string(src))
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", jsTemplate, err)
	}
	var b bytes.Buffer
	if err := t.Execute(&b, newJSContract()); err != nil {
		return nil, fmt.Errorf("render %s: %w", JSFile, err)
	}
	return b.Bytes(), nil
}
