package main

import (
	"bytes"
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
