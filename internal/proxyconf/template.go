package proxyconf

import (
	"fmt"
	"io/fs"
	"text/template"

	"github.com/turnout/turnout"
)

// Assets returns fsys, or turnout's embedded templates when fsys is nil
// (the renderers take another tree only in tests).
func Assets(fsys fs.FS) fs.FS {
	if fsys == nil {
		return turnout.Assets
	}
	return fsys
}

// ParseTemplates parses the template files from fsys (Assets(fsys)) under
// name, strict about missing keys: a renamed field fails the render instead
// of writing "<no value>" into a proxy's config.
func ParseTemplates(fsys fs.FS, name string, files ...string) (*template.Template, error) {
	t, err := template.New(name).Option("missingkey=error").ParseFS(Assets(fsys), files...)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", files[0], err)
	}
	return t, nil
}
