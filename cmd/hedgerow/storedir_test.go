package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/internal/natstest"
)

// The default store is one per HTTP address: two serves of one machine on
// two addresses keep their states apart, a restart on one address finds its
// state again, and a port chosen at start gets a temporary store.
func TestDefaultStoreDirIsOnePerHTTPAddress(t *testing.T) {
	base := os.Getenv("XDG_STATE_HOME")
	for listen, want := range map[string]string{
		"127.0.0.1:8080": "127.0.0.1-8080",
		"127.0.0.1:8090": "127.0.0.1-8090",
		":8080":          "any-8080",
		"[::1]:8080":     "__1-8080",
	} {
		dir, temporary, err := defaultStoreDir(listen)
		if err != nil || temporary || dir != filepath.Join(base, "hedgerow", "nats", want) {
			t.Errorf("defaultStoreDir(%q) = %q, %v, %v; want %s under hedgerow/nats, kept", listen, dir, temporary, err, want)
		}
	}
	a, err := openServeStore("", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b, err := openServeStore("", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if a.dir == b.dir || !a.remove || !b.remove {
		t.Errorf("two serves on port 0 got stores %q and %q; want two temporary ones", a.dir, b.dir)
	}
	a.Close()
	b.Close()
	for _, dir := range []string{a.dir, b.dir} {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("temporary store %s outlived its serve: %v", dir, err)
		}
	}
}

// A second serve on a store another serve holds refuses before it starts
// a NATS server there, naming the directory and the first one's pid; the
// first one goes on serving.
func TestASecondServeOnTheSameStoreRefusesClearly(t *testing.T) {
	listen := natstest.FreeAddr(t)
	path := writeConfig(t, "", fakeUpstream(t, 0))
	cfg, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(string(cfg), "127.0.0.1:0", listen, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	first, proc := startProcess(t, "serve", "--config", path)
	first.waitFor(servingURL)

	start := time.Now()
	out, err := runRoot(t, "serve", "--config", path)
	store := filepath.Join(os.Getenv("XDG_STATE_HOME"), "hedgerow", "nats", strings.ReplaceAll(listen, ":", "-"))
	if err == nil || !strings.Contains(err.Error(), store) || !strings.Contains(err.Error(), "held by another hedgerow serve") ||
		!strings.Contains(err.Error(), "pid "+strconv.Itoa(proc.Pid)) {
		t.Errorf("second serve: %v\n%s\nwant a refusal naming %s and pid %d", err, out, store, proc.Pid)
	}
	if strings.Contains(out, "serving") || time.Since(start) > 5*time.Second {
		t.Errorf("second serve started before refusing (%v):\n%s", time.Since(start), out)
	}
	if code, _ := getBody(t, "http://"+listen+"/healthz"); code != 200 {
		t.Errorf("the first serve stopped answering: /healthz %d", code)
	}
	if err := first.stop(); err != nil {
		t.Fatalf("first serve: %v", err)
	}
	// Stopped, it lets the next serve on that address have its store.
	again, _ := startProcess(t, "serve", "--config", path)
	again.waitFor(servingURL)
	if err := again.stop(); err != nil {
		t.Fatalf("serve after the first stopped: %v", err)
	}
}
