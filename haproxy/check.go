package haproxy

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/turnout/turnout/route"
)

// Check renders cfg into a scratch directory (so paths inside point there)
// and runs "haproxy -c" on it. The real files are untouched.
func (r *Renderer) Check(ctx context.Context, haproxyBin string, cfg *route.Config, opts RenderOptions) error {
	tmp, err := os.MkdirTemp("", "turnout-haproxy-check-")
	if err != nil {
		return fmt.Errorf("haproxy check: %w", err)
	}
	defer os.RemoveAll(tmp)
	opts.Dir = tmp
	opts.Socket = filepath.Join(tmp, DefaultSocketName)
	opts.PIDFile = filepath.Join(tmp, DefaultPIDFileName)
	out, err := r.Render(cfg, opts)
	if err != nil {
		return err
	}
	if err := writeFiles(tmp, out.Files()); err != nil {
		return err
	}
	return CheckFile(ctx, haproxyBin, filepath.Join(tmp, ConfigFile))
}

// CheckFile runs "haproxy -c -f path" and returns its output on failure.
func CheckFile(ctx context.Context, haproxyBin, path string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, haproxyBin, "-c", "-q", "-f", path).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%w: haproxy -c: %w: %s", ErrRender, err, bytes.TrimSpace(out))
	}
	return nil
}
