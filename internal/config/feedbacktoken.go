package config

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Feedback is authenticated by default. Without a token, anything able to
// send a datagram from an allowed source (any local process; a spoofed
// loopback address) could close decisions and, with id=- lines, claim an
// endpoint answers in time. feedback.token is written into the rendered
// proxy log formats, so `turnout render` (run on its own) and `turnout
// serve` must agree on it without the operator choosing one: when none is
// configured, both read feedback.token_file, and the first to need it
// creates it (0600, 32 random URL-safe characters, linked into place, so
// two starting at once agree). A config loaded without a file (the built-in default)
// has no place to keep one and stays unauthenticated.

// DefaultFeedbackTokenFile is feedback.token_file's default, beside the
// config file.
const DefaultFeedbackTokenFile = "feedback.token"

// FeedbackTokenOff as feedback.token_file keeps feedback unauthenticated.
const FeedbackTokenOff = "off"

// resolveFeedbackToken reads the lines' token from the token file (relative
// paths are taken from dir, the config file's directory), creating it when
// create is set. A token file that cannot be created (a read-only config
// mount) leaves feedback unauthenticated, with a warning; a token file with
// a bad token is an error. Without create, a missing file is left for the
// command that renders or serves to create.
func (c *Config) resolveFeedbackToken(dir string, create bool) error {
	f := &c.Feedback
	if f.Token != "" || f.Disable || f.TokenFile == FeedbackTokenOff {
		return nil
	}
	path := f.TokenFile
	if path == "" {
		path = DefaultFeedbackTokenFile
	}
	if !filepath.IsAbs(path) {
		path = filepath.Join(dir, path)
	}
	if !create {
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return nil
		}
	}
	tok, err := readOrCreateToken(path)
	if err != nil {
		c.warnings = append(c.warnings, &FieldError{Path: "feedback.token_file", Line: c.Line("feedback.token_file"), Msg: fmt.Sprintf(
			"no feedback token: %v; feedback is unauthenticated (any local process can close decisions): set feedback.token, a writable feedback.token_file, or token_file: off to silence this", err)})
		return nil
	}
	if !tokenRe.MatchString(tok) {
		return fmt.Errorf("%w: feedback.token_file %s: the token must be 16-128 characters of A-Z a-z 0-9 _ -", ErrConfig, path)
	}
	f.fileToken = tok
	return nil
}

// LineToken is the token every feedback line must carry (the rendered log
// formats write it): feedback.token, else the token file's; "" for none.
// /internal/done asks only for an explicit feedback.token: its calls must
// name a live decision (48 random bits), while a syslog line without an id
// (id=-) still feeds stall detection, so only the lines need the default
// guard, and `make run` users can close decisions by hand.
func (f *FeedbackConfig) LineToken() string {
	if f.Token != "" {
		return f.Token
	}
	return f.fileToken
}

// readOrCreateToken reads the token in path, creating the file first when
// it does not exist.
func readOrCreateToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		return strings.TrimSpace(string(b)), nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	var raw [24]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", fmt.Errorf("generate a token: %w", err)
	}
	tok := base64.RawURLEncoding.EncodeToString(raw[:])
	// Written beside it, then linked into place: the other command never
	// reads a half-written file, and link fails if one got there first.
	tmp, err := os.CreateTemp(filepath.Dir(path), ".feedback-token-*")
	if err != nil {
		return "", fmt.Errorf("create %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	_, werr := tmp.WriteString(tok + "\n")
	if cerr := tmp.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return "", fmt.Errorf("write %s: %w", path, werr)
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return readOrCreateToken(path) // created meanwhile by the other command
		}
		return "", fmt.Errorf("create %s: %w", path, err)
	}
	return tok, nil
}
