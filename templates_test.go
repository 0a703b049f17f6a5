package turnout_test

import (
	"io/fs"
	"regexp"
	"strings"
	"testing"

	"github.com/turnout/turnout"

	"github.com/turnout/turnout/route/contract"
)

// The proxy templates spell no name, error body or feedback field the glue
// contract owns (contract.ContractLiterals): they render them from the tables,
// so a contract change reaches every glue. Comments may name them.
func TestTemplatesSpellNoContractLiteral(t *testing.T) {
	// Template comments, whole-line '#', '--' and '//' comments, and
	// trailing '--' and '//' comments (Lua, JavaScript).
	comment := regexp.MustCompile(`\{\{-?\s*/\*(?s:.*?)\*/\s*-?\}\}|/\*(?s:.*?)\*/|(?m:^[ \t]*#.*$)|(?m:(^|[ \t])(--|//) .*$)`)
	lits := contract.ContractLiterals()
	if len(lits) < 20 {
		t.Fatalf("only %d contract literals", len(lits))
	}
	for _, name := range []string{"templates/haproxy.cfg.tmpl", "templates/haproxy-spoe.snippets.tmpl", "templates/nginx.conf.tmpl",
		"templates/nginx-turnout.js", "lua/turnout.lua.tmpl"} {
		b, err := fs.ReadFile(turnout.Assets, name)
		if err != nil {
			t.Fatal(err)
		}
		src := strings.ToLower(comment.ReplaceAllString(string(b), ""))
		for _, l := range lits {
			if strings.Contains(src, strings.ToLower(l)) {
				t.Errorf("%s spells %q: render it from route's contract", name, l)
			}
		}
	}
}

// The check sees a hand-written literal (it can fail).
func TestContractLiteralsCatchHandWritten(t *testing.T) {
	for _, l := range []string{"proxy_hide_header X-Turnout-Server;", `return 404 '{"error":{"message":"not found"}}'`, `log-format "x id=%ID srv=%s"`} {
		found := false
		for _, c := range contract.ContractLiterals() {
			found = found || strings.Contains(strings.ToLower(l), strings.ToLower(c))
		}
		if !found {
			t.Errorf("%q passes the literal check", l)
		}
	}
}
