package node

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/simulator/fakellm"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

// limitedFake is a fake provider enforcing a provider key's requests per
// real minute, as `hedgerow fakellm --instant 1 --requests-per-minute N`
// does (its bucket holds a minute's worth and starts full), counting what
// it answered by status.
type limitedFake struct {
	url      string
	answered atomic.Int64 // 200
	refused  atomic.Int64 // 429: the provider's limit met
}

func startLimitedFake(t *testing.T, route, rpm int) *limitedFake {
	t.Helper()
	m, err := fakellm.InstantModel(1)
	if err != nil {
		t.Fatal(err)
	}
	f := &limitedFake{}
	f.url = fakeServer(t, route, m, fakellm.Options{TimeScale: 1, RateLimit: workload.RateLimit{RPM: rpm},
		OnRecord: func(r fakellm.Record) {
			switch r.Status {
			case http.StatusOK:
				f.answered.Add(1)
			case http.StatusTooManyRequests:
				f.refused.Add(1)
			}
		}}) + "/v1"
	return f
}

// A route with requests_per_minute set, driven far above it, never gets a
// 429 from its provider (the fake enforcing the same limit): the requests
// its slice cannot take go to the other route of their pool, or, in a pool
// with no other route, are refused by hedgerow 429 overloaded with a
// Retry-After (docs/architecture.md §7, "Route capacity").
func TestARouteDrivenAboveItsRequestsPerMinuteNeverGetsA429FromItsProvider(t *testing.T) {
	const rpm = 60 // one a second; the fakes' buckets hold 60
	a, c := startLimitedFake(t, 0, rpm), startLimitedFake(t, 2, rpm)
	// fake-b answers in about 50 ms, fake-a at once: the picker prefers a
	// for every primary, so every primary meets a's limit first.
	b := fakeServer(t, 1, calmModel(t), fakellm.Options{TimeScale: 0.25}) + "/v1"
	y := fmt.Sprintf(`nats:
  urls: [nats://127.0.0.1:4222]
http:
  listen: 127.0.0.1:0
routes:
  - {name: fake-a, provider: openai, base_url: %q, model: m, labels: {region: a}, limits: {requests_per_minute: %d}}
  - {name: fake-b, provider: openai, base_url: %q, model: m, labels: {region: b}}
  - {name: fake-c, provider: openai, base_url: %q, model: m, labels: {region: c}, limits: {requests_per_minute: %d}}
pools:
  general: {routes: [fake-a, fake-b]}
  solo: {routes: [fake-c], queue_wait: 100ms}
policies:
  default: {control_fraction: 0, deadline: 5s, heartbeat_interval: 50ms}
`, a.url, rpm, b, c.url, rpm)
	cfg, err := config.Parse("capacity.yaml", []byte(y), config.RoleServe, os.LookupEnv)
	if err != nil {
		t.Fatalf("config: %v\n%s", err, y)
	}
	s, err := StartServe(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer stop(t, s)
	base := "http://" + s.HTTPAddr().String()

	// Twice each limited fake's whole bucket, 50 a second to each pool
	// (3,000 a minute, 50 times the limit), so the slices refill a few
	// times over the run.
	const perPool = 2 * rpm
	type answer struct {
		pool       string
		status     int
		retryAfter string
		body       string
	}
	jobs := make(chan string)
	answers := make(chan answer, 2*perPool)
	var wg sync.WaitGroup
	client := &http.Client{Timeout: wait, Transport: &http.Transport{DisableKeepAlives: true}}
	start := time.Now()
	for range 8 {
		wg.Go(func() {
			for pool := range jobs {
				resp, err := client.Post(base+"/v1/chat/completions", "application/json",
					strings.NewReader(`{"model":"`+pool+`","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`))
				if err != nil {
					t.Errorf("%s: %v", pool, err)
					continue
				}
				body := readBody(t, resp)
				answers <- answer{pool: pool, status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), body: body}
			}
		})
	}
	tick := time.NewTicker(20 * time.Millisecond)
	for range perPool {
		<-tick.C
		jobs <- "general"
		jobs <- "solo"
	}
	tick.Stop()
	close(jobs)
	wg.Wait()
	elapsed := time.Since(start)
	close(answers)

	solo := map[int]int{}
	for ans := range answers {
		switch {
		case ans.pool == "general" && ans.status != http.StatusOK:
			t.Errorf("general: %d %s, want every request answered (fake-b has no limit)", ans.status, ans.body)
		case ans.pool == "solo" && ans.status == http.StatusTooManyRequests:
			if sec, err := strconv.Atoi(ans.retryAfter); err != nil || sec < 1 || !strings.Contains(ans.body, "overloaded") {
				t.Errorf("solo refused with Retry-After %q and %s, want overloaded with a Retry-After of whole seconds", ans.retryAfter, ans.body)
			}
		case ans.pool == "solo" && ans.status != http.StatusOK:
			t.Errorf("solo: %d %s, want 200 or 429 overloaded", ans.status, ans.body)
		}
		if ans.pool == "solo" {
			solo[ans.status]++
		}
	}
	// What each limited route may take: its slice's bucket (one request)
	// and its refill (one a second), and what the slice held ahead.
	bound := int64(2 + elapsed.Seconds() + 1)
	for _, f := range []struct {
		name string
		fake *limitedFake
	}{{"fake-a", a}, {"fake-c", c}} {
		if n := f.fake.refused.Load(); n > 0 {
			t.Errorf("%s answered 429 %d times: hedgerow sent it past its own limit", f.name, n)
		}
		if n := f.fake.answered.Load(); n > bound || n < 1 {
			t.Errorf("%s answered %d requests in %v, want 1 to %d at %d a minute", f.name, n, elapsed, bound, rpm)
		}
	}
	if solo[http.StatusOK] < 1 || solo[http.StatusTooManyRequests] < perPool/2 {
		t.Errorf("solo: %v, want a few answered and most refused 429", solo)
	}
	// Every primary of general met a's limit first; the slices' metrics
	// are the gateway's.
	_, metrics := get(t, base+"/metrics")
	refusedA := metricValue(t, string(metrics), `hedgerow_route_capacity_refusals_total{limit="requests",route="fake-a"}`)
	if refusedA < perPool/2 {
		t.Errorf("a's limit refused %v primaries, want most of general's %d: a was not driven above it", refusedA, perPool)
	}
	if v := metricValue(t, string(metrics), `hedgerow_slice_refusals_total{kind="route_requests"}`); v < refusedA {
		t.Errorf("the slices counted %v refusals, under the dispatcher's %v", v, refusedA)
	}
	t.Logf("%v: fake-a answered %d (%v primaries refused and moved), fake-c %d; solo %v", elapsed.Round(time.Millisecond),
		a.answered.Load(), refusedA, c.answered.Load(), solo)

	// The same load straight at a fake enforcing the same limit meets its
	// 429s: without route capacity, hedgerow would have passed them on.
	control := startLimitedFake(t, 0, rpm)
	for range perPool {
		resp, err := client.Post(control.url+"/chat/completions", "application/json",
			strings.NewReader(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		readBody(t, resp)
	}
	if control.refused.Load() < int64(perPool-rpm-int(time.Since(start).Seconds())-1) {
		t.Errorf("the control fake refused %d of %d: its limit does not bite at this load", control.refused.Load(), perPool)
	}
}

// readBody reads and closes an answer's body.
func readBody(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Error(err)
	}
	return string(b)
}

// metricValue is the value of the sample named (with its labels) in a
// /metrics text.
func metricValue(t *testing.T, metrics, sample string) float64 {
	t.Helper()
	for _, line := range strings.Split(metrics, "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	t.Fatalf("/metrics has no %s", sample)
	return 0
}

// A route's limits are the gateway's alone: serve takes them on reload
// (its workers never read them), and the next requests keep to them,
// while any other change of its routes still takes a restart.
func TestServeReloadsARoutesLimitsAndKeepsToThem(t *testing.T) {
	a := startLimitedFake(t, 0, 0) // counts what it answers; no limit of its own
	urlB := fakeRoute(t, 1)
	cfg := parse(t, a.url, urlB, "")
	s, err := StartServe(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer stop(t, s)
	base := "http://" + s.HTTPAddr().String()
	reload := func(edit func(string) string) error {
		y := edit(configText(a.url, urlB, ""))
		return s.Reload(func() (*config.Config, error) {
			return config.Parse("node.yaml", []byte(y), config.RoleServe, os.LookupEnv)
		})
	}
	// One request a minute on fake-a, a burst of one.
	limitA := func(y string) string {
		return strings.Replace(y, "labels: {region: a}}", "labels: {region: a}, limits: {requests_per_minute: 1}}", 1)
	}
	if err := reload(limitA); err != nil {
		t.Fatalf("reloading fake-a's limits: %v", err)
	}
	moveB := func(y string) string { return strings.Replace(limitA(y), urlB, urlB+"/", 1) }
	if err := reload(moveB); !errors.Is(err, ErrRestartRequired) || !strings.Contains(err.Error(), "routes") {
		t.Fatalf("reloading a new base_url in serve: %v, want ErrRestartRequired naming routes", err)
	}
	for i := range 10 {
		req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions",
			strings.NewReader(`{"model":"general","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		if status, body := do(t, req); status != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, status, body)
		}
	}
	if n := a.answered.Load(); n > 1 {
		t.Fatalf("fake-a answered %d requests after its limit of one a minute was reloaded", n)
	}
}
