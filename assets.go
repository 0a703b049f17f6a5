// Package turnout carries the files the binary needs at run time: proxy
// config templates and the Lua glue, embedded so a single binary can render a
// working HAProxy (and later nginx) setup without a source checkout.
package turnout

import "embed"

// Assets holds templates/ and lua/ as they are in the repository. Whole
// directories are embedded so new proxy templates need no change here.
//
//go:embed templates lua
var Assets embed.FS
