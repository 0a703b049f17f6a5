package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// Every command and subcommand answers --help on stdout with exit 0, its own
// flags (and not another command's) and one example.
func TestHelp(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		want    []string
		notWant []string
	}{
		{[]string{"--help"}, []string{"turnout-lab mock", "turnout-lab bench"}, []string{"turnout serve"}},
		{[]string{"help"}, []string{"turnout-lab mock"}, nil},
		{[]string{"mock", "--help"}, []string{"-listen", "-model", "-time-scale", "-kv-events"}, []string{"-config"}},
		{[]string{"bench", "--help"}, []string{"replay", "cost"}, nil},
		{[]string{"bench", "replay", "--help"}, []string{"-trace", "-policies", "-mode", "-turnout-bin", "-fronts", "-nats-server"}, []string{"-rounds"}},
		{[]string{"bench", "azure", "--help"}, []string{"-trace"}, nil},
		{[]string{"bench", "cost", "--help"}, []string{"-duration", "-rounds", "-conns", "-turnout-bin"}, []string{"-trace"}},
		{[]string{"bench", "transports", "--help"}, []string{"-duration", "-rounds", "-conns", "-grpc-conns", "-policy"}, []string{"-trace"}},
		{[]string{"bench", "trivial", "--help"}, []string{"-listen"}, nil},
		{[]string{"bench", "policies", "--help"}, []string{"bench policies"}, nil},
		{[]string{"hog", "--help"}, []string{"-cpus", "-for"}, []string{"-listen"}},
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

// A bad flag is an error (exit 1) naming the flag and pointing at this
// binary's --help; an unknown command exits 2.
func TestBadFlag(t *testing.T) {
	for _, args := range [][]string{{"mock", "--nope"}, {"bench", "cost", "--nope"}} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != 1 {
			t.Fatalf("%v: exit %d", args, code)
		}
		if !strings.Contains(errb.String(), "see turnout-lab ") || !strings.Contains(errb.String(), "flag provided but not defined") {
			t.Errorf("%v: stderr %s", args, errb.String())
		}
	}
	var out, errb bytes.Buffer
	if code := run([]string{"serve"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), `unknown command "serve"`) {
		t.Errorf("serve in the lab: exit %d, stderr %s", code, errb.String())
	}
}

// A misspelt command or bench subcommand gets the nearest real one.
func TestLabDidYouMean(t *testing.T) {
	t.Setenv("TURNOUT_LOG_FORMAT", "text")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"mokc"}, `did you mean "mock"?`},
		{[]string{"bench", "replai"}, `did you mean "replay"?`},
		{[]string{"mock", "--time-scal", "1"}, "did you mean --time-scale?"},
	} {
		var out, errb bytes.Buffer
		run(tc.args, &out, &errb)
		if !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: stderr lacks %q:\n%s", tc.args, tc.want, errb.String())
		}
	}
}

// The hog keeps its threads busy for --for and stops by itself.
func TestHogSpinsAndStops(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	if n := hog(ctx, 2); n == 0 {
		t.Fatal("hog ran no spin rounds")
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("hog stopped %v after its context, want promptly", el)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"hog", "--cpus", "1", "--for", "20ms"}, &out, &errb); code != 0 {
		t.Fatalf("turnout-lab hog --for 20ms: exit %d, stderr:\n%s", code, errb.String())
	}
	if code := run([]string{"hog", "--cpus", "0"}, &out, &errb); code == 0 {
		t.Fatal("turnout-lab hog --cpus 0: exit 0, want an error")
	}
}
