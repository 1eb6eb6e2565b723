package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var natsServingURL = regexp.MustCompile(`nats=(nats://\S+)`)

// The whole path against an instant route, side by side with the route
// itself, over each front door: every request is answered and the report
// has the added row.
func TestBenchComparesTheGatewayWithItsRouteCalledDirectly(t *testing.T) {
	noLeaks(t)
	fake := startCmd(t, "fakellm", "--listen", "127.0.0.1:0", "--instant", "20")
	fakeURL := fake.waitFor(servingURL)
	// Timeouts, an in-flight limit and a queue wait that a burst under
	// -race on a loaded 2-core machine cannot reach: what this test
	// measures is that every request is answered, not how fast.
	dir := t.TempDir()
	path := filepath.Join(dir, "hedgerow.yaml")
	if err := os.WriteFile(path, []byte(`http: {listen: 127.0.0.1:0}
nats: {listen: "127.0.0.1:0", server_config: auth/nats-server.conf, nkey_seed_file: auth/serve.nk}
routes:
  - {name: fake-0, provider: openai, base_url: "`+fakeURL+`/v1", model: m, max_inflight: 4096}
pools:
  general: {routes: [fake-0], queue_wait: 20s}
policies:
  default: {accept_timeout: 5s, heartbeat_interval: 100ms, heartbeat_timeout: 5s}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	// serve's NATS listener admits only the users generated for it; bench
	// submits as the client user.
	if out, err := runRoot(t, "nats-auth", "--serve", "--config", path, "--out", filepath.Join(dir, "auth")); err != nil {
		t.Fatalf("nats-auth: %v\n%s", err, out)
	}
	serve := startCmd(t, "serve", "--config", path)
	line := serve.waitFor(regexp.MustCompile(`(msg=serving .*)`))
	gateway := servingURL.FindStringSubmatch(line)
	natsURL := natsServingURL.FindStringSubmatch(line)
	if gateway == nil || natsURL == nil {
		t.Fatalf("serve printed %q: want its http and nats addresses", line)
	}
	for _, door := range [][]string{{"--url", gateway[1]}, {"--nats", natsURL[1], "--nats-nkey-seed", filepath.Join(dir, "auth", "client.nk"), "--nats-inbox-prefix", "_INBOX.cl.client"}} {
		args := append([]string{"bench", "--compare-direct", fakeURL, "--rate", "100", "--duration", "1s", "--warmup", "200ms",
			"--max-tokens", "20", "--json", "--quiet"}, door...)
		// bench prints its whole report, then fails when requests failed:
		// the report says which and why.
		out, benchErr := runRoot(t, args...)
		var rep struct {
			Gateway struct {
				Via      string `json:"via"`
				Requests int    `json:"requests"`
				OK       int    `json:"ok"`
			} `json:"gateway"`
			Direct *struct {
				Requests int `json:"requests"`
				OK       int `json:"ok"`
			} `json:"direct"`
			Added *struct {
				P50 *float64 `json:"p50_ms"`
				P99 *float64 `json:"p99_ms"`
			} `json:"added"`
		}
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("bench %s: %v; output is not one JSON object: %v\n%s", strings.Join(door, " "), benchErr, err, out)
		}
		switch {
		case rep.Gateway.Requests == 0 || rep.Gateway.OK != rep.Gateway.Requests || rep.Gateway.Via != map[string]string{"--url": "http", "--nats": "nats"}[door[0]]:
			t.Errorf("bench %s: gateway %+v, want every request answered over %s (%v); the report says why:\n%s", door[0], rep.Gateway, door[0], benchErr, out)
		case rep.Direct == nil || rep.Direct.Requests == 0 || rep.Direct.OK != rep.Direct.Requests:
			t.Errorf("bench %s: direct %+v, want every request answered (%v); the report says why:\n%s", door[0], rep.Direct, benchErr, out)
		case rep.Added == nil || rep.Added.P50 == nil || rep.Added.P99 == nil:
			t.Errorf("bench %s: no added latency:\n%s", door[0], out)
		case benchErr != nil:
			t.Errorf("bench %s: every request answered, yet bench failed: %v\n%s", door[0], benchErr, out)
		}
	}
	if err := serve.stop(); err != nil {
		t.Fatalf("serve: %v", err)
	}
	if err := fake.stop(); err != nil {
		t.Fatalf("fakellm: %v", err)
	}
}

func TestBenchNeedsExactlyOneGateway(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "--quiet"},
		{"bench", "--url", "http://127.0.0.1:1", "--nats", "nats://127.0.0.1:1", "--quiet"},
	} {
		out, err := runRoot(t, args...)
		if err == nil || !strings.Contains(err.Error(), "exactly one of --url and --nats") {
			t.Errorf("%v: err %v, output %q", args, err, out)
		}
	}
}

// bench prints its whole report, then exits non-zero naming the failures
// when any request failed.
func TestBenchFailsAfterItsReportWhenRequestsFailed(t *testing.T) {
	fake := startCmd(t, "fakellm", "--listen", "127.0.0.1:0", "--instant", "5")
	fakeURL := fake.waitFor(servingURL)
	// The gateway URL is a closed port: every request fails; the direct
	// route answers.
	out, err := runRoot(t, "bench", "--url", "http://127.0.0.1:1", "--compare-direct", fakeURL, "--rate", "50",
		"--duration", "200ms", "--warmup", "0s", "--timeout", "2s", "--json", "--quiet")
	var rep struct {
		Gateway struct {
			Requests, Errors int
		} `json:"gateway"`
		Direct *struct{ OK int } `json:"direct"`
	}
	if jerr := json.Unmarshal([]byte(out), &rep); jerr != nil || rep.Gateway.Requests == 0 || rep.Direct == nil {
		t.Fatalf("bench printed no whole report before failing (%v): %q", jerr, out)
	}
	if err == nil || !strings.Contains(err.Error(), "requests failed") || !strings.Contains(err.Error(), "gateway:") ||
		exitCode(err) == 0 {
		t.Fatalf("bench with %d failed requests returned %v, want a non-zero exit naming the failures", rep.Gateway.Errors, err)
	}
	if err := fake.stop(); err != nil {
		t.Fatalf("fakellm: %v", err)
	}
}
