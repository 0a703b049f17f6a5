package control

import (
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/internal/config"
)

// With haproxy.user/group the unix SPOE socket is handed to them (owner,
// 0660): workers that dropped root can connect. Without, it is left alone.
func TestShareSPOESocket(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown needs root")
	}
	u, err := user.Lookup("nobody")
	if err != nil {
		t.Skip("no user nobody")
	}
	for _, tc := range []struct {
		user    string
		wantUID int
	}{{"", 0}, {"nobody", atoi(u.Uid)}} {
		sock := filepath.Join(t.TempDir(), "spoe.sock")
		ln, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		cfg := &config.Config{}
		cfg.HAProxy.User = tc.user
		log := zerolog.Nop()
		shareSPOESocket("unix@"+sock, cfg, &log)
		fi, err := os.Stat(sock)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if int(st.Uid) != tc.wantUID {
			t.Errorf("user %q: socket owner %d, want %d", tc.user, st.Uid, tc.wantUID)
		}
		if tc.user != "" && fi.Mode().Perm() != 0o660 {
			t.Errorf("user %q: mode %v, want 0660", tc.user, fi.Mode().Perm())
		}
		ln.Close()
	}
}

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }
