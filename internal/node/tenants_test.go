package node

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/hedgerow/hedgerow/client"
	"github.com/hedgerow/hedgerow/internal/config"
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
