package proxyconf

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

var errBase = errors.New("test render")

func TestCheckerCollectsEveryProblem(t *testing.T) {
	c := NewChecker(errBase, "TestProxy")
	if got := c.Path("dir", "/ok/path"); got != "/ok/path" {
		t.Fatalf("Path = %q", got)
	}
	hp, host, port := c.Addr("listen", "[::1]:8080")
	if hp != "[::1]:8080" || host != "::1" || port != 8080 {
		t.Fatalf("Addr(::1) = %q %q %d", hp, host, port)
	}
	c.Name("name", "pool-a.1")
	c.Header("hdr", "X-Session-Id")
	if err := c.Err(); err != nil {
		t.Fatalf("good values refused: %v", err)
	}

	bad := []struct{ field string }{{"dir"}, {"listen"}, {"host"}, {"name"}, {"hdr"}}
	c.Path("dir", "relative/path")
	c.Addr("listen", "localhost")
	c.Addr("host", "a b:80")
	c.Name("name", "bad name")
	if c.Header("hdr", "X-Bad:Header") {
		t.Error("Header accepted a colon")
	}
	err := c.Err()
	if !errors.Is(err, errBase) {
		t.Fatalf("errors do not wrap the renderer's: %v", err)
	}
	for _, b := range bad {
		if !strings.Contains(err.Error(), errBase.Error()+": "+b.field+": ") {
			t.Errorf("no problem reported for %s in:\n%v", b.field, err)
		}
	}
	if !strings.Contains(err.Error(), "TestProxy cannot take") {
		t.Errorf("host message does not name the proxy: %v", err)
	}
}

func TestWriteFileAtomicLeavesUnchangedFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "a.cfg")
	if err := WriteFiles(dir, []File{{Name: "a.cfg", Data: []byte("one\n")}}); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(p, old, old); err != nil {
		t.Fatal(err)
	}
	if err := WriteFileAtomic(p, []byte("one\n")); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(p); !fi.ModTime().Equal(old) {
		t.Errorf("an unchanged file was rewritten (mtime %v)", fi.ModTime())
	}
	if err := WriteFileAtomic(p, []byte("two\n")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); string(b) != "two\n" {
		t.Errorf("content %q, want two", b)
	}
}

type files []File

func (f files) Files() []File { return f }

func TestCheckRenderUsesScratchDir(t *testing.T) {
	var seen string
	err := CheckRender("proxyconf-test-", func(dir string) (files, error) {
		seen = dir
		return files{{Name: "x.cfg", Data: []byte(dir)}}, nil
	}, func(dir string) error {
		if b, err := os.ReadFile(filepath.Join(dir, "x.cfg")); err != nil || string(b) != dir {
			t.Errorf("check sees %q, %v; want the render for %s", b, err, dir)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(seen); !os.IsNotExist(err) {
		t.Errorf("scratch dir %s left behind (%v)", seen, err)
	}
	want := errors.New("check failed")
	if err := CheckRender("proxyconf-test-", func(string) (files, error) { return nil, nil }, func(string) error { return want }); !errors.Is(err, want) {
		t.Errorf("check error lost: %v", err)
	}
}

func TestReadPIDRefusesOtherPrograms(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "x.pid")
	if err := os.WriteFile(p, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/proc/self/comm"); err == nil {
		if _, err := ReadPID(p, "haproxy"); err == nil || !strings.Contains(err.Error(), "not haproxy") {
			t.Errorf("a pid of another program was accepted: %v", err)
		}
	}
	comm, _ := os.ReadFile("/proc/self/comm")
	if name := strings.TrimSpace(string(comm)); name != "" {
		if pid, err := ReadPID(p, name); err != nil || pid != os.Getpid() {
			t.Errorf("ReadPID(own pid, %q) = %d, %v", name, pid, err)
		}
	}
	for _, bad := range []string{"", "1", "abc"} {
		_ = os.WriteFile(p, []byte(bad), 0o644)
		if _, err := ReadPID(p, "nginx"); err == nil {
			t.Errorf("pid file %q accepted", bad)
		}
	}
}

func TestInDir(t *testing.T) {
	var a, b string
	c := "/set"
	InDir(&a, "/d/", "x.pid")
	InDir(&b, "", "x.pid")
	InDir(&c, "/d", "x.pid")
	if a != "/d/x.pid" || b != "" || c != "/set" {
		t.Errorf("InDir: %q %q %q", a, b, c)
	}
}
