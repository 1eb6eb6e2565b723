package main

import (
	"net/http"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/hedgerow/hedgerow/internal/config"
)

// serve reloads its tenants on SIGHUP: a key the new file adds works, the
// one it removes gets 401, and a file with problems leaves the running
// configuration serving.
func TestServeReloadsTenantsOnSIGHUP(t *testing.T) {
	noLeaks(t)
	const oldKey, newKey = "sk-reload-old", "sk-reload-new"
	tenants := func(key string) string {
		return "tenants:\n  acme: {api_key_hashes: [" + config.HashAPIKey(key) + "]}\n"
	}
	upA, upB := fakeUpstream(t, 0), fakeUpstream(t, 1)
	path := writeConfig(t, tenants(oldKey), upA, upB)
	rewrite := func(extra string) {
		t.Helper()
		data, err := os.ReadFile(writeConfig(t, extra, upA, upB))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	r := startCmd(t, "serve", "--config", path)
	base := r.waitFor(servingURL)
	chat := func(key string) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions",
			strings.NewReader(`{"model":"general","max_tokens":10,"messages":[{"role":"user","content":"hello"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+key)
		client := &http.Client{Timeout: cmdWait, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	hangup := func() {
		t.Helper()
		if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	if got := chat(oldKey); got != http.StatusOK {
		t.Fatalf("old key before the reload: %d", got)
	}
	if got := chat(newKey); got != http.StatusUnauthorized {
		t.Fatalf("new key before the reload: %d, want 401", got)
	}

	rewrite(tenants(newKey))
	hangup()
	r.waitFor(regexp.MustCompile(`(configuration reloaded)`))
	if got := chat(newKey); got != http.StatusOK {
		t.Fatalf("new key after the reload: %d", got)
	}
	if got := chat(oldKey); got != http.StatusUnauthorized {
		t.Fatalf("old key after the reload: %d, want 401", got)
	}

	rewrite(tenants(oldKey) + "tenantz: {}\n")
	hangup()
	r.waitFor(regexp.MustCompile(`(configuration reload failed)`))
	if got := chat(newKey); got != http.StatusOK {
		t.Fatalf("new key after a refused reload: %d", got)
	}
	if got := chat(oldKey); got != http.StatusUnauthorized {
		t.Fatalf("old key after a refused reload: %d, want 401", got)
	}
	if err := r.stop(); err != nil {
		t.Fatalf("serve: %v", err)
	}
}
