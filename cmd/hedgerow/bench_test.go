package main

import (
	"encoding/json"
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
	// Timeouts a burst under -race on a busy machine cannot reach.
	path := writeConfig(t, "nats: {listen: \"127.0.0.1:0\"}\n"+
		"policies:\n  default: {accept_timeout: 5s, heartbeat_interval: 100ms, heartbeat_timeout: 5s}\n", fakeURL+"/v1")
	serve := startCmd(t, "serve", "--config", path)
	line := serve.waitFor(regexp.MustCompile(`(msg=serving .*)`))
	gateway := servingURL.FindStringSubmatch(line)
	natsURL := natsServingURL.FindStringSubmatch(line)
	if gateway == nil || natsURL == nil {
		t.Fatalf("serve printed %q: want its http and nats addresses", line)
	}
	for _, door := range [][]string{{"--url", gateway[1]}, {"--nats", natsURL[1]}} {
		args := append([]string{"bench", "--compare-direct", fakeURL, "--rate", "100", "--duration", "1s", "--warmup", "200ms",
			"--max-tokens", "20", "--json", "--quiet"}, door...)
		out, err := runRoot(t, args...)
		if err != nil {
			t.Fatalf("bench %s: %v\n%s", strings.Join(door, " "), err, out)
		}
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
			t.Fatalf("bench %s: output is not one JSON object: %v\n%s", door[0], err, out)
		}
		switch {
		case rep.Gateway.Requests == 0 || rep.Gateway.OK != rep.Gateway.Requests || rep.Gateway.Via != map[string]string{"--url": "http", "--nats": "nats"}[door[0]]:
			t.Errorf("bench %s: gateway %+v, want every request answered over %s; the report says why:\n%s", door[0], rep.Gateway, door[0], out)
		case rep.Direct == nil || rep.Direct.Requests == 0 || rep.Direct.OK != rep.Direct.Requests:
			t.Errorf("bench %s: direct %+v, want every request answered; the report says why:\n%s", door[0], rep.Direct, out)
		case rep.Added == nil || rep.Added.P50 == nil || rep.Added.P99 == nil:
			t.Errorf("bench %s: no added latency:\n%s", door[0], out)
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
