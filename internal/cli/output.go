package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/config"
)

// NewLogger builds the one root logger; packages get it through struct fields.
// human: zerolog's console format (a person at a terminal), else JSON lines.
func NewLogger(w io.Writer, level string, human bool) *zerolog.Logger {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil || level == "" {
		lvl = zerolog.InfoLevel
	}
	if human {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: "15:04:05.000", NoColor: true}
	}
	l := zerolog.New(w).Level(lvl).With().Timestamp().Logger()
	zerolog.TimeFieldFormat = time.RFC3339Nano
	return &l
}

// HumanOutput decides between text for a person and JSON lines for a log
// collector: TURNOUT_LOG_FORMAT=text|json|journald when set, else text when stderr is
// a terminal.
func HumanOutput(stderr io.Writer, format string) bool {
	switch format {
	case "text", "console":
		return true
	case "json", "journald":
		return false
	}
	f, ok := stderr.(*os.File)
	return ok && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd()))
}

// ReportError prints a command's final error. Config errors list every
// problem with its line and field: as indented text for a person, as one
// JSON event per problem (file, line, field, error) for a collector.
func ReportError(stderr io.Writer, log *zerolog.Logger, human bool, what string, err error) {
	if human {
		fmt.Fprintf(stderr, "%s: %v\n", what, err)
		return
	}
	var ce *config.ConfigError
	// One problem or several: the same events, so a collector parses one shape.
	if errors.As(err, &ce) && len(ce.Problems) > 0 {
		for _, p := range ce.Problems {
			logProblem(log.Error(), ce.File, p).Msg("config problem")
		}
	}
	log.Error().Err(err).Msg(what)
}

// logProblem adds a config problem's fields to a log event.
func logProblem(ev *zerolog.Event, file string, p *config.FieldError) *zerolog.Event {
	if file != "" {
		ev = ev.Str("file", file)
	}
	if p.Line > 0 {
		ev = ev.Int("line", p.Line)
	}
	if p.Path != "" {
		ev = ev.Str("field", p.Path)
	}
	return ev.Str("problem", p.Msg)
}

// LogWarnings logs what the config accepted but probably did not mean.
// extra are a command's own warnings about the config, logged the same way.
func LogWarnings(log *zerolog.Logger, file string, cfg *config.Config, extra ...*config.FieldError) {
	for _, w := range slices.Concat(cfg.Warnings(), extra) {
		logProblem(log.Warn(), file, w).Msg("config warning")
	}
}

// WithFile names the config file in a config error raised after loading
// (policies are built from the parsed config, which does not know its file).
func WithFile(err error, file string) error {
	var ce *config.ConfigError
	if file != "" && errors.As(err, &ce) && ce.File == "" {
		ce.File = file
	}
	return err
}

// Output is how a binary reports: its logger (TURNOUT_LOG_FORMAT,
// TURNOUT_LOG_LEVEL) and whether stderr gets text for a person.
type Output struct {
	Log    *zerolog.Logger
	Human  bool
	stdout io.Writer
	stderr io.Writer
}

// NewOutput sets up a binary's reporting from the environment.
func NewOutput(stdout, stderr io.Writer) *Output {
	format := os.Getenv("TURNOUT_LOG_FORMAT")
	human := HumanOutput(stderr, format)
	return &Output{
		Log:   NewLogger(LogWriter(stderr, format), os.Getenv("TURNOUT_LOG_LEVEL"), human),
		Human: human, stdout: stdout, stderr: stderr,
	}
}

// Exit turns a command's error into the exit status: 0 for none or a help
// text (printed to stdout), 1 after reporting any other error as what.
func (o *Output) Exit(what string, err error) int {
	if err == nil {
		return 0
	}
	var h *HelpShown
	if errors.As(err, &h) {
		fmt.Fprint(o.stdout, h.Text)
		return 0
	}
	ReportError(o.stderr, o.Log, o.Human, what, err)
	return 1
}

// Main runs a binary's subcommand: the usage on stderr (exit 2) without one
// and on stdout (exit 0) for help, "unknown command" with the nearest of
// known (exit 2) for a name cmds does not have, else the command, whose
// error becomes the exit status (Output.Exit).
func Main(prog, usage string, known []string, cmds map[string]func(args []string, log *zerolog.Logger) error, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	run, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "%s\n\n%s", UnknownCommand(prog, args[0], known), usage)
		return 2
	}
	out := NewOutput(stdout, stderr)
	return out.Exit(prog+" "+args[0], run(args[1:], out.Log))
}
