package node

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/client"
	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/internal/natsauth"
	"github.com/hedgerow/hedgerow/internal/redistest"
	"github.com/hedgerow/hedgerow/schemas"
)

// Two gateways sharing Redis share each tenant's request limits, over
// both doors: the tenant's burst of 2, spent once through each gateway —
// over HTTP on one, over NATS with the Go client's key on the other — is
// gone for both.
func TestGatewaysSharingRedisShareATenantsRequestRateOverBothDoors(t *testing.T) {
	const key = "sk-limited-tenant"
	rs := redistest.Start(t)
	t.Setenv("NODE_TEST_HASH_KEY", "node-test-hash-key")
	cfg := parse(t, fakeRoute(t, 0), fakeRoute(t, 1), `redis: {url: "`+rs.URL()+`", key_prefix: tltest, hash_key_env: NODE_TEST_HASH_KEY}
tenants:
  acme: {api_key_hashes: [`+config.HashAPIKey(key)+`], requests_per_second: 0.001, burst: 2}
`)
	s, g, users := serveWithSecondGateway(t, cfg)

	chat := func(base string) (int, []byte, http.Header) {
		req, err := http.NewRequest(http.MethodPost, "http://"+base+"/v1/chat/completions",
			strings.NewReader(`{"model":"general","max_tokens":20,"messages":[{"role":"user","content":"hello"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+key)
		client := &http.Client{Timeout: wait, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, body, resp.Header
	}
	if status, body, _ := chat(s.HTTPAddr().String()); status != http.StatusOK {
		t.Fatalf("first request, HTTP on the first gateway: %d %s", status, body)
	}
	copts, err := users.Options(natsauth.UserClient)
	if err != nil {
		t.Fatal(err)
	}
	callerConn, err := Connect([]string{s.NATSURL()}, "caller", nil, copts...)
	if err != nil {
		t.Fatal(err)
	}
	defer callerConn.Close()
	submit := func(opts ...client.Option) error {
		c, err := client.New(callerConn, append(opts, client.WithTimeout(wait))...)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Submit(context.Background(), client.Request{ModelClass: "general",
			Request: schemas.ChatRequest{Messages: []schemas.Message{{Role: schemas.MessageUser, Content: schemas.TextContent("hello")}}, MaxTokens: 20}})
		return err
	}
	var herr *client.Error
	if err := submit(); !errors.As(err, &herr) || herr.Code != schemas.ErrUnauthenticated || herr.Status != http.StatusUnauthorized {
		t.Fatalf("NATS request without a key: %v; want unauthenticated (401)", err)
	}
	if err := submit(client.WithAPIKey(key)); err != nil {
		t.Fatalf("second request, NATS with the key: %v", err)
	}
	status, body, h := chat(g.Addr().String())
	if status != http.StatusTooManyRequests || !strings.Contains(string(body), "tenant_rate_limited") || h.Get("Retry-After") == "" {
		t.Fatalf("third request, HTTP on the second gateway: %d %s (Retry-After %q); want 429 tenant_rate_limited",
			status, body, h.Get("Retry-After"))
	}
	if err := submit(client.WithAPIKey(key)); !errors.As(err, &herr) || herr.Code != schemas.ErrTenantRateLimited || herr.RetryAfter <= 0 {
		t.Fatalf("fourth request, NATS: %v; want tenant_rate_limited with a retry-after", err)
	}
	status, metrics := get(t, "http://"+g.Addr().String()+"/metrics")
	if status != http.StatusOK || !strings.Contains(string(metrics), `hedgerow_tenant_limit_refusals_total{reason="rate"}`) {
		t.Fatalf("metrics: %d, no refusal counter", status)
	}
}

// serveWithSecondGateway starts serve on cfg (its NATS admitting only the
// generated users) and a second gateway process's worth on its NATS, as the
// gateway user: a replica beside serve's own gateway. Both stop with the
// test; the users' credentials come back for other roles' connections.
func serveWithSecondGateway(t *testing.T, cfg *config.Config) (*Serve, *Gateway, *natsauth.Local) {
	t.Helper()
	users := localUsers(t, cfg)
	s, err := StartServe(cfg, Options{})
	if err != nil {
		t.Fatalf("StartServe: %v", err)
	}
	t.Cleanup(func() { stop(t, s) })
	gopts, err := users.Options(natsauth.UserGateway)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := Connect([]string{s.NATSURL()}, "second-gateway", nil, gopts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	g, err := StartGateway(cfg, nc, nil, Options{})
	if err != nil {
		t.Fatalf("StartGateway: %v", err)
	}
	t.Cleanup(func() { stop(t, g) })
	return s, g, users
}

// redisAway is how long TestTwoGatewaysKeepATenantsRateWhileRedisIsAway
// keeps Redis down: short in make test, -slices.away=30s for the issue's
// measurement.
var redisAway = flag.Duration("slices.away", 3*time.Second, "how long Redis stays down in the two-gateway tenant-rate run")

// Two gateways that lose Redis keep a tenant's request rate: each spends
// what its slice holds, then its safe share — the rate ÷ the two gateways
// it saw alive —, never unbounded (before slices, a gateway that could not
// reach Redis admitted every request: 376 of 378 in 10 s against 5/s). A
// Redis restarted empty is found again and the safe shares end.
func TestTwoGatewaysKeepATenantsRateWhileRedisIsAway(t *testing.T) {
	const (
		key  = "sk-limited-tenant"
		rate = 5.0 // requests a second, a burst of as many
	)
	away := *redisAway
	rs := redistest.Start(t)
	t.Setenv("NODE_TEST_HASH_KEY", "node-test-hash-key")
	cfg := parse(t, fakeRoute(t, 0), fakeRoute(t, 1), `redis: {url: "`+rs.URL()+`", key_prefix: awaytest, hash_key_env: NODE_TEST_HASH_KEY, timeout: 50ms}
tenants:
  acme: {api_key_hashes: [`+config.HashAPIKey(key)+`], requests_per_second: 5, burst: 5}
`)
	s, g, _ := serveWithSecondGateway(t, cfg)
	gateways := []string{s.HTTPAddr().String(), g.Addr().String()}
	gauge := func(addr, name string) float64 {
		_, body := get(t, "http://"+addr+"/metrics")
		for line := range strings.Lines(string(body)) {
			if v, ok := strings.CutPrefix(line, name+" "); ok {
				f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
				if err != nil {
					t.Fatalf("%s: %q", name, line)
				}
				return f
			}
		}
		return -1
	}
	for _, addr := range gateways {
		eventually.True(t, wait, "each gateway sees both alive", func() bool {
			return gauge(addr, "hedgerow_slice_gateways_alive") == 2
		})
	}
	client := &http.Client{Timeout: wait}
	chat := func(addr string) int {
		req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat/completions",
			strings.NewReader(`{"model":"general","max_tokens":5,"messages":[{"role":"user","content":"hello"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode == http.StatusTooManyRequests && strings.Contains(string(body), "tenant_rate_limited") {
			return http.StatusTooManyRequests
		}
		return resp.StatusCode // admitted by the tenant's limits, whatever then became of it
	}

	rs.Kill()
	admitted := make([]atomic.Int64, len(gateways))
	refused := make([]atomic.Int64, len(gateways))
	var wg sync.WaitGroup
	deadline := time.Now().Add(away)
	for i, addr := range gateways {
		for range 2 {
			wg.Go(func() {
				// 50 requests a second each: 20 times the tenant's rate
				// per gateway, without starving a 2-core machine.
				tick := time.NewTicker(20 * time.Millisecond)
				defer tick.Stop()
				for time.Now().Before(deadline) {
					if chat(addr) == http.StatusTooManyRequests {
						refused[i].Add(1)
					} else {
						admitted[i].Add(1)
					}
					<-tick.C
				}
			})
		}
	}
	wg.Wait()
	elapsed := away + time.Since(deadline) // the last requests' answers came after the deadline
	for i, addr := range gateways {
		// Its slice (at most two leads of its use, at most the burst),
		// then half the burst and half the rate.
		bound := rate + rate/2 + rate/2*elapsed.Seconds()
		t.Logf("gateway %d without Redis for %v: %d admitted, %d refused (bound %.1f)", i, elapsed.Round(time.Millisecond), admitted[i].Load(), refused[i].Load(), bound)
		if float64(admitted[i].Load()) > bound {
			t.Errorf("gateway %d admitted %d requests of the tenant in %v without Redis; its slice and safe share allow %.1f", i, admitted[i].Load(), elapsed, bound)
		}
		if refused[i].Load() == 0 {
			t.Errorf("gateway %d refused none of the tenant's requests without Redis", i)
		}
		if v := gauge(addr, "hedgerow_slice_safe_share"); v != 1 {
			t.Errorf("gateway %d: hedgerow_slice_safe_share = %v without Redis; want 1", i, v)
		}
	}
	rs.Restart() // empty
	for i, addr := range gateways {
		eventually.True(t, wait, fmt.Sprintf("gateway %d off its safe share once Redis answers", i), func() bool {
			chat(addr)
			return gauge(addr, "hedgerow_slice_safe_share") == 0
		})
	}
}
