// Package cli is the command-line plumbing the turnout and turnout-lab
// binaries share: flag sets whose --help is a request (exit 0) and whose
// errors point at --help, the root logger, and how a command's final error
// and a config's problems and warnings are reported.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
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
// bad flag an error that names it and points at --help.
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
		return fmt.Errorf("%s: %w (see %s %s --help)", fs.Name(), err, prog, fs.Name())
	}
	return nil
}

// Help renders the synopsis, description, example and flag defaults.
func (c Command) Help(fs *flag.FlagSet) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Usage: %s\n\n%s\n\nExample:\n  %s\n", c.Synopsis, strings.TrimSpace(c.About), c.Example)
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n > 0 {
		b.WriteString("\nFlags:\n")
		fs.SetOutput(&b)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
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
