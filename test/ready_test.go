//go:build e2e

package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/turnout/turnout/lab/mock"
)

func getReadyz(t *testing.T, url string) (int, string) {
	t.Helper()
	r, err := http.Get(url + "/readyz?verbose")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return r.StatusCode, string(b)
}

// TestReadyzServe: `turnout serve` in front of four replicas that are all
// down is not ready from its first answer on; with min_ready 2 it stays
// not ready while one replica is up and becomes ready with the second.
func TestReadyzServe(t *testing.T) {
	addrs := []string{FreeAddr(t), FreeAddr(t), FreeAddr(t), FreeAddr(t)}
	listen := FreeAddr(t)
	var eps strings.Builder
	for i, a := range addrs {
		fmt.Fprintf(&eps, "          - {name: r%d, address: %q}\n", i, a)
	}
	tu := StartTurnout(t, listen, fmt.Sprintf(`listen: %s
feedback: {disable: true}
health: {interval: 100ms, timeout: 300ms, min_ready: 2}
deployments:
  - name: llama
    policy: {name: round-robin}
    pools:
      - role: mixed
        endpoints:
%s`, listen, eps.String()))
	// From the very first answer (healthz just passed) until well after
	// several rounds: 503.
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if code, body := getReadyz(t, tu.URL); code != 503 {
			t.Fatalf("ready with every replica down: %d %q", code, body)
		}
	}
	if _, body := getReadyz(t, tu.URL); !strings.Contains(body, "pool llama_mixed: 0/4 available") {
		t.Fatalf("verbose: %q", body)
	}
	start := func(addr string) {
		cfg := mock.DefaultConfig()
		cfg.Name = addr
		l := zerolog.Nop()
		s, err := mock.New(cfg, &l)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Start(addr); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
	}
	start(addrs[1])
	Eventually(t, 10*time.Second, "one replica seen up", func() bool {
		_, body := getReadyz(t, tu.URL)
		return strings.Contains(body, "1/4 available")
	})
	if code, body := getReadyz(t, tu.URL); code != 503 {
		t.Fatalf("1 of 4 up with min_ready 2: %d %q", code, body)
	}
	start(addrs[3])
	Eventually(t, 10*time.Second, "ready with two replicas up", func() bool {
		code, _ := getReadyz(t, tu.URL)
		return code == 200
	})
}
