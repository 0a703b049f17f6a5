package nginx

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/turnout/turnout/internal/config"

	"github.com/turnout/turnout/internal/proxyconf"
)

// Check renders cfg into a scratch directory (so every path inside points
// there) and runs "nginx -t" on it. The real files are untouched.
func (r *Renderer) Check(ctx context.Context, nginxBin string, cfg *config.Config, opts RenderOptions) error {
	if err := CheckFiles(cfg); err != nil {
		return err
	}
	return proxyconf.CheckRender("turnout-nginx-check-", func(tmp string) (*Rendered, error) {
		opts.Dir, opts.PIDFile, opts.ErrorLog = tmp, filepath.Join(tmp, PIDFileName), filepath.Join(tmp, ErrorLogName)
		return r.Render(cfg, opts)
	}, func(tmp string) error {
		// nginx creates only the last component of its temp paths.
		if err := os.MkdirAll(filepath.Join(tmp, "tmp"), 0o755); err != nil {
			return fmt.Errorf("nginx dir: %w", err)
		}
		return CheckDir(ctx, nginxBin, tmp)
	})
}

// CheckDir runs "nginx -t" on DIR/nginx.conf with DIR as the prefix and
// startup errors on stderr, so nothing outside DIR is needed or touched.
func CheckDir(ctx context.Context, nginxBin, dir string) error {
	return proxyconf.RunCheck(ctx, ErrRender, "nginx -t", nginxBin, "-t", "-q", "-p", dir, "-c", filepath.Join(dir, ConfigFile), "-e", "stderr")
}

// WriteFiles writes the files into dir atomically (proxyconf.WriteFiles),
// after creating dir/tmp for nginx's temp paths (nginx creates only their
// last component).
func WriteFiles(dir string, files []File) error {
	if err := os.MkdirAll(filepath.Join(dir, "tmp"), 0o755); err != nil {
		return fmt.Errorf("nginx dir: %w", err)
	}
	return proxyconf.WriteFiles(dir, files)
}
