package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
)

// Every command and subcommand answers --help on stdout with exit 0, its own
// flags (and not another command's) and one example.
func TestHelp(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		want    []string
		notWant []string
	}{
		{[]string{"--help"}, []string{"turnout serve", "turnout render", "turnout-lab"}, []string{"turnout mock", "turnout bench"}},
		{[]string{"help"}, []string{"turnout serve"}, nil},
		{[]string{"serve", "--help"}, []string{"-config", "-listen", "-haproxy-dir", "-nginx-dir", "-watch", "-log-level"}, []string{"-out"}},
		{[]string{"serve", "-h"}, []string{"-config"}, nil},
		{[]string{"render", "--help"}, []string{"haproxy", "nginx", "render haproxy --help"}, nil},
		{[]string{"render", "haproxy", "--help"}, []string{"-config", "-out", "-socket", "run haproxy -c"}, []string{"-nginx-user", "-nginx-js-module", "nginx -t"}},
		{[]string{"render", "nginx", "--help"}, []string{"-config", "-out", "-nginx-user", "-nginx-js-module", "run nginx -t"}, []string{"-socket", "haproxy -c", "admin stats socket"}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := run(tc.args, &out, &errb); code != 0 {
				t.Fatalf("exit %d, stderr:\n%s", code, errb.String())
			}
			if errb.Len() > 0 {
				t.Errorf("help wrote to stderr: %s", errb.String())
			}
			got := out.String()
			if !strings.Contains(got, "Example:") {
				t.Errorf("no example in:\n%s", got)
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("help lacks %q:\n%s", w, got)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(got, w) {
					t.Errorf("help has %q, which is not this command's:\n%s", w, got)
				}
			}
		})
	}
}

// A bad flag is an error (exit 1) naming the flag and pointing at --help.
func TestBadFlag(t *testing.T) {
	for _, args := range [][]string{{"serve", "--bogus"}, {"render", "nginx", "--socket", "x"}} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != 1 {
			t.Fatalf("%v: exit %d", args, code)
		}
		if !strings.Contains(errb.String(), "see turnout ") || !strings.Contains(errb.String(), "flag provided but not defined") {
			t.Errorf("%v: stderr %s", args, errb.String())
		}
	}
}

// The lab's commands are not the serving binary's: asking for them names
// the binary that has them.
func TestLabCommandsElsewhere(t *testing.T) {
	for _, cmd := range []string{"mock", "bench"} {
		var out, errb bytes.Buffer
		if code := run([]string{cmd}, &out, &errb); code != 2 {
			t.Errorf("turnout %s: exit %d, want 2", cmd, code)
		}
		if !strings.Contains(errb.String(), "turnout-lab") {
			t.Errorf("turnout %s: stderr does not point at turnout-lab:\n%s", cmd, errb.String())
		}
	}
}

// Flag lists spell flags as the synopses do (--config), never Go's -config.
func TestHelpFlagSpelling(t *testing.T) {
	for _, args := range [][]string{{"serve", "--help"}, {"render", "haproxy", "--help"}, {"render", "nginx", "--help"}, {"check", "--help"}} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errb.String())
		}
		if !strings.Contains(out.String(), "\n  --config FILE") && !strings.Contains(out.String(), "\n  --config string") {
			t.Errorf("%v: no --config in the flag list:\n%s", args, out.String())
		}
		if regexp.MustCompile(`\n  -[a-z]`).MatchString(out.String()) {
			t.Errorf("%v: a flag listed with one dash:\n%s", args, out.String())
		}
	}
}

// A misspelt flag, command or render target gets the nearest real one.
func TestDidYouMean(t *testing.T) {
	t.Setenv("TURNOUT_LOG_FORMAT", "text")
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"serve", "--confg", "x.yaml"}, 1, "did you mean --config?"},
		{[]string{"render", "haproxy", "--sockt", "x"}, 1, "did you mean --socket?"},
		{[]string{"serv"}, 2, `did you mean "serve"?`},
		{[]string{"rendr"}, 2, `did you mean "render"?`},
		{[]string{"render", "ngnix"}, 1, `did you mean "nginx"?`},
	} {
		var out, errb bytes.Buffer
		if code := run(tc.args, &out, &errb); code != tc.code {
			t.Errorf("%v: exit %d, want %d", tc.args, code, tc.code)
		}
		if !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: stderr lacks %q:\n%s", tc.args, tc.want, errb.String())
		}
	}
}

// version --help is help, not the version.
func TestVersionHelp(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"version", "--help"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if !strings.HasPrefix(out.String(), "Usage: turnout version") {
		t.Errorf("version --help printed:\n%s", out.String())
	}
	out.Reset()
	if code := run([]string{"version"}, &out, &errb); code != 0 || out.String() != "turnout "+version+"\n" {
		t.Errorf("version: exit %d, %q", code, out.String())
	}
}
