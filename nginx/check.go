package nginx

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/google/renameio"
	"github.com/turnout/turnout/route"
)

// Check renders cfg into a scratch directory (so every path inside points
// there) and runs "nginx -t" on it. The real files are untouched.
func (r *Renderer) Check(ctx context.Context, nginxBin string, cfg *route.Config, opts RenderOptions) error {
	tmp, err := os.MkdirTemp("", "turnout-nginx-check-")
	if err != nil {
		return fmt.Errorf("nginx check: %w", err)
	}
	defer os.RemoveAll(tmp)
	opts.Dir = tmp
	opts.PIDFile = filepath.Join(tmp, PIDFileName)
	opts.ErrorLog = filepath.Join(tmp, ErrorLogName)
	out, err := r.Render(cfg, opts)
	if err != nil {
		return err
	}
	if err := WriteFiles(tmp, out.Files()); err != nil {
		return err
	}
	return CheckDir(ctx, nginxBin, tmp)
}

// CheckDir runs "nginx -t" on DIR/nginx.conf with DIR as the prefix and
// startup errors on stderr, so nothing outside DIR is needed or touched.
func CheckDir(ctx context.Context, nginxBin, dir string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, nginxBin, "-t", "-q", "-p", dir, "-c", filepath.Join(dir, ConfigFile), "-e", "stderr")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%w: nginx -t: %w: %s", ErrRender, err, bytes.TrimSpace(out))
	}
	return nil
}

// WriteFiles writes the files into dir, each through a temporary file and a
// rename so nginx never reads half a file, and creates dir/tmp for nginx's
// temp paths (nginx creates only their last component).
func WriteFiles(dir string, files []File) error {
	if err := os.MkdirAll(filepath.Join(dir, "tmp"), 0o755); err != nil {
		return fmt.Errorf("nginx dir: %w", err)
	}
	for _, f := range files {
		// renameio: temp file + rename, so a reloading nginx never reads half a file.
		if err := renameio.WriteFile(filepath.Join(dir, f.Name), f.Data, 0o644); err != nil {
			return fmt.Errorf("write %s: %w", f.Name, err)
		}
	}
	return nil
}
