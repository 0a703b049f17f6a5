// Package cli is the command-line plumbing the turnout and turnout-lab
// binaries share: the subcommand dispatch (Main), flag sets whose --help is
// a request (exit 0) and whose errors point at --help, the context the stop
// signals end, the root logger, and how a command's final error and a
// config's problems and warnings are reported.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/turnout/turnout/internal/suggest"
)

// HelpShown carries a command's help text up to the binary's run(), which
// prints it on stdout and exits 0: "--help" is a request, not an error.
type HelpShown struct{ Text string }

func (h *HelpShown) Error() string { return "help requested" }

// Command describes one (sub)command for its --help: a synopsis line, what it
// does, and one example. Prog is the binary that runs it ("turnout" when
// empty), named in the hint after a bad flag.
type Command struct {
	Prog, Synopsis, About, Example string
}

// NewFlags returns a FlagSet whose own messages are silenced: ParseFlags
// prints help and usage errors itself, once, on the right stream.
func NewFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// ParseFlags parses args; -h/--help returns *HelpShown with the full help, a
// bad flag an error that names it, suggests the nearest flag and points at
// --help.
func ParseFlags(fs *flag.FlagSet, c Command, args []string) error {
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		return &HelpShown{Text: c.Help(fs)}
	}
	if err != nil {
		prog := c.Prog
		if prog == "" {
			prog = "turnout"
		}
		hint := ""
		if name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -"); ok {
			var names []string
			fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
			if best := suggest.Nearest(name, names); best != "" {
				hint = "; did you mean --" + best + "?"
			}
		}
		return fmt.Errorf("%s: %w%s (see %s %s --help)", fs.Name(), err, hint, prog, fs.Name())
	}
	return nil
}

// UnknownCommand is the message for a command that does not exist, with the
// nearest known one when there is a likely one.
func UnknownCommand(prog, got string, known []string) string {
	msg := fmt.Sprintf("%s: unknown command %q", prog, got)
	if best := suggest.Nearest(got, known); best != "" {
		msg += fmt.Sprintf("; did you mean %q?", best)
	}
	return msg
}

// Help renders the synopsis, description, example and flags. Flags are
// listed as --name, the spelling the synopses and docs use (Go's flag
// package accepts both and would print -name).
func (c Command) Help(fs *flag.FlagSet) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Usage: %s\n\n%s\n\nExample:\n  %s\n", c.Synopsis, strings.TrimSpace(c.About), c.Example)
	first := true
	fs.VisitAll(func(f *flag.Flag) {
		if first {
			b.WriteString("\nFlags:\n")
			first = false
		}
		name, usage := flag.UnquoteUsage(f)
		fmt.Fprintf(&b, "  --%s", f.Name)
		if name != "" {
			fmt.Fprintf(&b, " %s", name)
		}
		b.WriteString("\n    \t")
		b.WriteString(strings.ReplaceAll(usage, "\n", "\n    \t"))
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" && f.DefValue != "0s" {
			if name == "string" {
				fmt.Fprintf(&b, " (default %q)", f.DefValue)
			} else {
				fmt.Fprintf(&b, " (default %v)", f.DefValue)
			}
		}
		b.WriteString("\n")
	})
	return b.String()
}

// WantsHelp reports whether args ask for help before any target is named.
func WantsHelp(args []string) bool {
	for _, a := range args {
		switch a {
		case "-h", "-help", "--help", "help":
			return true
		}
	}
	return false
}

// StopContext is a command's context: done at SIGINT or SIGTERM, the signals
// a terminal or a service manager stops it with. Call stop when done.
func StopContext() (ctx context.Context, stop context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}
