package node

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/internal/config"
)

// A reload (SIGHUP) takes over the file's tenants and pools without a
// restart: a key added works, a key removed gets 401, a pool added answers;
// a file with problems, or one changing a section only a restart applies,
// leaves the running configuration serving. Each reload is counted.
func TestReloadTakesOverTenantsAndPoolsAndKeepsTheRunningConfigurationOnABadFile(t *testing.T) {
	const oldKey, newKey = "sk-old-tenant-key", "sk-new-tenant-key"
	urlA, urlB := fakeRoute(t, 0), fakeRoute(t, 1)
	tenants := func(key string) string {
		return "tenants:\n  acme: {api_key_hashes: [" + config.HashAPIKey(key) + "]}\n"
	}
	cfg := parse(t, urlA, urlB, tenants(oldKey))
	s, err := StartServe(cfg, Options{})
	if err != nil {
		t.Fatalf("StartServe: %v", err)
	}
	defer stop(t, s)
	base := "http://" + s.HTTPAddr().String()
	chat := func(key, model string) (int, string) {
		req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions",
			strings.NewReader(`{"model":"`+model+`","max_tokens":20,"messages":[{"role":"user","content":"hello"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+key)
		status, body := do(t, req)
		return status, string(body)
	}
	morePools := func(y string) string {
		return strings.Replace(y, "pools:\n", "pools:\n  second: {routes: [fake-b]}\n", 1)
	}
	smallerBodies := func(y string) string { return strings.Replace(y, "http:\n", "http:\n  body_limit: 1MiB\n", 1) }
	same := func(y string) string { return y }
	reload := func(extra string, edit func(string) string) error {
		y := edit(configText(urlA, urlB, extra))
		return s.Reload(func() (*config.Config, error) {
			return config.Parse("node.yaml", []byte(y), config.RoleServe, os.LookupEnv)
		})
	}
	expect := func(step, key, model string, want int) {
		t.Helper()
		if status, body := chat(key, model); status != want {
			t.Fatalf("%s: %s key, model %s: %d %.300s; want %d", step, key, model, status, body, want)
		}
	}
	reloads := func(result string) string {
		t.Helper()
		_, metrics := get(t, base+"/metrics")
		for _, line := range strings.Split(string(metrics), "\n") {
			if strings.HasPrefix(line, `hedgerow_config_reloads_total{result="`+result+`"} `) {
				return strings.TrimPrefix(line, `hedgerow_config_reloads_total{result="`+result+`"} `)
			}
		}
		t.Fatalf("/metrics has no hedgerow_config_reloads_total{result=%q}", result)
		return ""
	}

	expect("before reloading", oldKey, "general", http.StatusOK)
	expect("before reloading", newKey, "general", http.StatusUnauthorized)
	expect("before reloading", newKey, "second", http.StatusUnauthorized)

	if err := reload(tenants(newKey)+"  second: {routes: [fake-b]}\n", same); err == nil {
		t.Fatal("a file with a pool under tenants reloaded")
	}
	expect("after a refused reload", oldKey, "general", http.StatusOK)
	if err := reload(tenants(newKey), morePools); err != nil {
		t.Fatalf("reload: %v", err)
	}
	expect("after the reload", newKey, "general", http.StatusOK)
	expect("after the reload", newKey, "second", http.StatusOK)
	expect("after the reload", oldKey, "general", http.StatusUnauthorized)

	var problems config.Problems
	if err := reload("tenantz: {}\n", same); !errors.As(err, &problems) {
		t.Fatalf("reloading a file with an unknown key: %v, want its problems", err)
	}
	if err := reload(tenants(oldKey), func(y string) string { return morePools(smallerBodies(y)) }); !errors.Is(err, ErrRestartRequired) || !strings.Contains(err.Error(), "http") {
		t.Fatalf("reloading a new http section: %v, want ErrRestartRequired naming http", err)
	}
	// A region names the wire the doors and the dispatcher speak (§8).
	if err := reload(tenants(newKey), func(y string) string { return morePools(y) + "deployment: {region: east}\n" }); !errors.Is(err, ErrRestartRequired) || !strings.Contains(err.Error(), "deployment") {
		t.Fatalf("reloading a new region: %v, want ErrRestartRequired naming deployment", err)
	}
	if err := reload(tenants(newKey), func(y string) string {
		return morePools(y) + "deployment: {region: east}\nglobal: {regions: [east, west]}\n"
	}); !errors.Is(err, ErrRestartRequired) || !strings.Contains(err.Error(), "global") {
		t.Fatalf("reloading global ceilings: %v, want ErrRestartRequired naming global", err)
	}
	expect("after the refused reloads", newKey, "general", http.StatusOK)
	expect("after the refused reloads", oldKey, "general", http.StatusUnauthorized)
	if got := reloads("success"); got != "1" {
		t.Errorf("hedgerow_config_reloads_total{result=\"success\"} = %s, want 1", got)
	}
	if got := reloads("failure"); got != "5" {
		t.Errorf("hedgerow_config_reloads_total{result=\"failure\"} = %s, want 5", got)
	}
}

// A request in flight when the configuration is reloaded ends on the
// configuration that took it, with its answer; the next request meets the
// new tenants.
func TestARequestInFlightDuringAReloadIsAnsweredByTheConfigurationThatTookIt(t *testing.T) {
	const oldKey, newKey = "sk-inflight-old", "sk-inflight-new"
	entered, release := make(chan struct{}, 8), make(chan struct{})
	gated := func(n int) string {
		target, err := url.Parse(strings.TrimSuffix(fakeRoute(t, n), "/v1"))
		if err != nil {
			t.Fatal(err)
		}
		proxy := httputil.NewSingleHostReverseProxy(target)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case entered <- struct{}{}:
			default:
			}
			<-release
			proxy.ServeHTTP(w, r)
		}))
		t.Cleanup(srv.Close)
		return srv.URL + "/v1"
	}
	urlA, urlB := gated(0), gated(1)
	tenants := func(key string) string {
		return "tenants:\n  acme: {api_key_hashes: [" + config.HashAPIKey(key) + "]}\n"
	}
	s, err := StartServe(parse(t, urlA, urlB, tenants(oldKey)), Options{})
	if err != nil {
		t.Fatalf("StartServe: %v", err)
	}
	defer stop(t, s)
	defer close(release) // also on failure, so the gated attempts end before Stop
	chat := func(key string) (int, string) {
		req, err := http.NewRequest(http.MethodPost, "http://"+s.HTTPAddr().String()+"/v1/chat/completions",
			strings.NewReader(`{"model":"general","max_tokens":20,"messages":[{"role":"user","content":"hello"}]}`))
		if err != nil {
			t.Error(err)
			return 0, ""
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+key)
		client := &http.Client{Timeout: wait, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := client.Do(req)
		if err != nil {
			t.Error(err)
			return 0, ""
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	type answer struct {
		status int
		body   string
	}
	inflight := make(chan answer, 1)
	go func() {
		status, body := chat(oldKey)
		inflight <- answer{status, body}
	}()
	select {
	case <-entered:
	case <-time.After(wait):
		t.Fatal("the request's attempt never reached a route")
	}
	if err := s.Reload(func() (*config.Config, error) {
		return config.Parse("node.yaml", []byte(configText(urlA, urlB, tenants(newKey))), config.RoleServe, os.LookupEnv)
	}); err != nil {
		t.Fatalf("reload: %v", err)
	}
	release <- struct{}{} // one attempt may go on; the rest wait for the deferred close
	select {
	case a := <-inflight:
		if a.status != http.StatusOK {
			t.Fatalf("the request in flight during the reload: %d %.300s", a.status, a.body)
		}
	case <-time.After(wait):
		t.Fatal("the request in flight during the reload was never answered")
	}
	if status, body := chat(oldKey); status != http.StatusUnauthorized {
		t.Fatalf("the old key after the reload: %d %.300s, want 401", status, body)
	}
}

// A gateway (no workers of its own) takes over its routes on a reload: with
// fake-a gone from the file, every answer comes from fake-b, and a pool the
// file adds answers.
func TestAGatewayReloadTakesOverItsRoutesAndPools(t *testing.T) {
	urlA, urlB := fakeRoute(t, 0), fakeRoute(t, 1)
	cfg := parse(t, urlA, urlB, "")
	_, g, _ := serveWithSecondGateway(t, cfg)
	chat := func(model string) (int, string) {
		req, err := http.NewRequest(http.MethodPost, "http://"+g.Addr().String()+"/v1/chat/completions",
			strings.NewReader(`{"model":"`+model+`","max_tokens":20,"messages":[{"role":"user","content":"hello"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		client := &http.Client{Timeout: wait, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, resp.Header.Get(frontdoor.HeaderWinnerRoute)
	}
	if status, _ := chat("only-b"); status != http.StatusNotFound {
		t.Fatalf("a pool the file does not have yet: %d, want 404", status)
	}
	y := configText(urlA, urlB, "")
	y = regexp.MustCompile(`(?m)^  - \{name: fake-a,.*\n`).ReplaceAllString(y, "")
	y = strings.Replace(y, "general: {routes: [fake-a, fake-b]}", "general: {routes: [fake-b]}\n  only-b: {routes: [fake-b]}", 1)
	if err := g.Reload(func() (*config.Config, error) {
		next, err := config.Parse("node.yaml", []byte(y), config.RoleGateway, os.LookupEnv)
		if next != nil {
			next.NATS = cfg.NATS // what localUsers set, as the command's --nats overrides
		}
		return next, err
	}, false); err != nil {
		t.Fatalf("reload: %v", err)
	}
	for i := range 5 {
		for _, model := range []string{"general", "only-b"} {
			if status, route := chat(model); status != http.StatusOK || route != "fake-b" {
				t.Fatalf("request %d to %s after the reload: %d from route %q, want 200 from fake-b", i, model, status, route)
			}
		}
	}
}
