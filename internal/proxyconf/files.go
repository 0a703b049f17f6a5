package proxyconf

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/google/renameio"
)

// File is one rendered file: its name inside the proxy's directory and its bytes.
type File struct {
	Name string
	Data []byte
	// Private: the file holds a secret (the feedback token in a log
	// format), so only its owner may read it (0600; the proxy runs as that
	// user or reads its config as root). Other files are 0644.
	Private bool
}

// Perm is the file's mode bits.
func (f File) Perm() os.FileMode {
	if f.Private {
		return 0o600
	}
	return 0o644
}

// WriteFileAtomic writes data to path (mode 0644) through a temp file, an
// fsync and a rename (renameio), so a reloading proxy never reads half a
// file. An unchanged file is left alone.
func WriteFileAtomic(path string, data []byte) error { return writeFile(path, data, 0o644) }

// writeFile is WriteFileAtomic with the mode: an unchanged file with
// another mode (rendered before the token existed) only gets the mode.
func writeFile(path string, data []byte, perm os.FileMode) error {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		if fi, err := os.Stat(path); err == nil && fi.Mode().Perm() != perm {
			if err := os.Chmod(path, perm); err != nil {
				return fmt.Errorf("chmod %s: %w", path, err)
			}
		}
		return nil
	}
	if err := renameio.WriteFile(path, data, perm); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// WriteFiles writes each file into dir atomically with its mode (Perm), in
// order (the renderers list the main config last).
func WriteFiles(dir string, files []File) error {
	for _, f := range files {
		if err := writeFile(filepath.Join(dir, f.Name), f.Data, f.Perm()); err != nil {
			return err
		}
	}
	return nil
}

// InScratchDir runs fn in a fresh temporary directory (named after prefix)
// and removes it afterwards: a check renders there, so every path inside
// the files points there and the real files stay untouched.
func InScratchDir(prefix string, fn func(dir string) error) error {
	tmp, err := os.MkdirTemp("", prefix)
	if err != nil {
		return fmt.Errorf("%s: %w", prefix, err)
	}
	defer os.RemoveAll(tmp)
	return fn(tmp)
}

// CheckTimeout bounds one run of a proxy's config check.
const CheckTimeout = 30 * time.Second

// RunCheck runs a proxy's config check (bin args...) and returns an error
// wrapping base, naming the check as what, with its output when it fails.
func RunCheck(ctx context.Context, base error, what, bin string, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, CheckTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%w: %s: %w: %s", base, what, err, bytes.TrimSpace(out))
	}
	return nil
}

// CheckRender checks a render with the proxy's own binary, away from the
// real files: render renders for a fresh scratch directory (paths inside
// point there), its files are written there, and check runs on it.
func CheckRender[R interface{ Files() []File }](prefix string, render func(dir string) (R, error), check func(dir string) error) error {
	return InScratchDir(prefix, func(dir string) error {
		out, err := render(dir)
		if err != nil {
			return err
		}
		if err := WriteFiles(dir, out.Files()); err != nil {
			return err
		}
		return check(dir)
	})
}
