package cli

import (
	"errors"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

func TestMain_(t *testing.T) {
	var ran []string
	cmds := map[string]func([]string, *zerolog.Logger) error{
		"serve": func(a []string, _ *zerolog.Logger) error { ran = append(ran, strings.Join(a, ",")); return nil },
		"fail":  func([]string, *zerolog.Logger) error { return errors.New("boom") },
	}
	for _, c := range []struct {
		args           []string
		code           int
		stdout, stderr string
	}{
		{nil, 2, "", "USAGE"},
		{[]string{"help"}, 0, "USAGE", ""},
		{[]string{"--help"}, 0, "USAGE", ""},
		{[]string{"serv"}, 2, "", `prog: unknown command "serv"; did you mean "serve"?`},
		{[]string{"serve", "a", "b"}, 0, "", ""},
		{[]string{"fail"}, 1, "", "boom"},
	} {
		var out, errb strings.Builder
		t.Setenv("TURNOUT_LOG_FORMAT", "text")
		code := Main("prog", "USAGE", []string{"serve", "fail", "help"}, cmds, c.args, &out, &errb)
		if code != c.code || !strings.Contains(out.String(), c.stdout) || !strings.Contains(errb.String(), c.stderr) {
			t.Errorf("%q: code %d stdout %q stderr %q; want %d, %q, %q", c.args, code, out.String(), errb.String(), c.code, c.stdout, c.stderr)
		}
	}
	if len(ran) != 1 || ran[0] != "a,b" {
		t.Errorf("serve ran with %q, want once with a,b", ran)
	}
}
