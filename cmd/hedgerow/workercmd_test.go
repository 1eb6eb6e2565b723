package main

import (
	"regexp"
	"strings"
	"testing"

	"github.com/hedgerow/hedgerow/internal/natstest"
)

func TestWorkerServesTheRoutesAskedForUntilStopped(t *testing.T) {
	noLeaks(t)
	ns := natstest.Start(t, natstest.MaxPayload(8<<20))
	path := writeConfig(t, "nats: {urls: [\""+ns.ClientURL()+"\"]}\n", "http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1")
	r := startCmd(t, "worker", "--config", path, "--route", "fake-1", "--metrics-listen", "127.0.0.1:0")
	if routes := r.waitFor(regexp.MustCompile(`routes=(\S+)`)); routes != "[fake-1]" {
		t.Errorf("worker serves %s, want [fake-1]", routes)
	}
	if err := r.stop(); err != nil {
		t.Fatalf("worker: %v", err)
	}
}

func TestWorkerRefusesAnUnknownRoute(t *testing.T) {
	ns := natstest.Start(t, natstest.MaxPayload(8<<20))
	path := writeConfig(t, "nats: {urls: [\""+ns.ClientURL()+"\"]}\n", "http://127.0.0.1:1/v1")
	if out, err := runRoot(t, "worker", "--config", path, "--route", "nope"); err == nil {
		t.Fatalf("worker with an unknown route started:\n%s", out)
	}
}

// TestConfigCheckLetsAWorkerUseRedisWithoutTheHashKey: redis.url without
// redis.hash_key_env is fine for the worker role (its Redis holds route
// leases), while serve and gateway still need the key.
func TestConfigCheckLetsAWorkerUseRedisWithoutTheHashKey(t *testing.T) {
	path := writeConfig(t, "nats: {urls: [\"nats://127.0.0.1:4222\"]}\nredis: {url: \"redis://127.0.0.1:6379\"}\n",
		"http://127.0.0.1:1/v1")
	cases := []struct {
		role string
		ok   bool
	}{
		{"worker", true},
		{"gateway", false},
		{"serve", false},
	}
	for _, tc := range cases {
		t.Run(tc.role, func(t *testing.T) {
			out, err := runConfigCheck(t, path, "--role", tc.role)
			if tc.ok {
				if err != nil || out != "ok\n" {
					t.Fatalf("config check --role %s: %v\n%s", tc.role, err, out)
				}
				return
			}
			if err == nil || !strings.Contains(out, "redis.hash_key_env") {
				t.Fatalf("config check --role %s: %v\n%s; want a redis.hash_key_env problem", tc.role, err, out)
			}
		})
	}
}
