package node

import (
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/eventually"
)

// A gateway of region east, of two regions sharing its tenants' request
// rates, spends east's lease of them: with west not yet seen, west is
// reserved its safe share (half), so a tenant's burst of 10 admits 5 here,
// and the region renews its lease at the authority — the leases' bucket on
// serve's own JetStream — and says so in its metrics.
func TestAGatewayOfOneOfTwoRegionsSpendsItsRegionsLeaseOfATenantsRate(t *testing.T) {
	const key = "sk-global-tenant"
	cfg := parse(t, fakeRoute(t, 0), fakeRoute(t, 1), `deployment: {region: east}
global: {regions: [east, west]}
tenants:
  acme: {api_key_hashes: [`+config.HashAPIKey(key)+`], requests_per_second: 0.001, burst: 10}
`)
	s, err := StartServe(cfg, Options{})
	if err != nil {
		t.Fatalf("StartServe: %v", err)
	}
	t.Cleanup(func() { stop(t, s) })

	admitted := 0
	for range 10 {
		if askAs(t, s, key, "tenant_rate_limited") {
			admitted++
		}
	}
	if admitted != 5 {
		t.Fatalf("admitted %d of 10 against a burst of 10; want 5, east's half while west holds its safe share", admitted)
	}
	renewed := regexp.MustCompile(`(?m)^hedgerow_lease_renewals_total\{region="east",result="ok"\} (\S+)$`)
	eventually.True(t, wait, "east renews its lease at the authority and holds half of the tenant's rate", func() bool {
		_, metrics := get(t, "http://"+s.HTTPAddr().String()+"/metrics")
		m := renewed.FindSubmatch(metrics)
		if m == nil {
			return false
		}
		n, _ := strconv.ParseFloat(string(m[1]), 64)
		return n >= 1 && strings.Contains(string(metrics), `hedgerow_lease_share{kind="tenant_rate",region="east"} 0.5`)
	})
}

// A tenant's spend window held across regions is leased as an allowance:
// a gateway of region east, west not yet seen, first spends the floor
// (a twentieth of the window's 2,000 units) while the window's table
// learns, then its allowance grows with its demand — what it asked for,
// refused or not — so the same requests are admitted again.
func TestAGatewayOfOneOfTwoRegionsSpendsItsRegionsAllowanceOfATenantsSpendWindow(t *testing.T) {
	const key = "sk-global-spender"
	cfg := parse(t, fakeRoute(t, 0), fakeRoute(t, 1), `deployment: {region: east}
global: {regions: [east, west], lease_validity: 3s, max_clock_skew: 500ms, rebalance_interval: 1s}
tenants:
  acme: {api_key_hashes: [`+config.HashAPIKey(key)+`]}
`)
	cfg.Policies["default"].Spend = config.Spend{PerTenantWindow: 2000, Window: time.Hour}
	s, err := StartServe(cfg, Options{})
	if err != nil {
		t.Fatalf("StartServe: %v", err)
	}
	t.Cleanup(func() { stop(t, s) })
	ask := func() bool { return askAs(t, s, key, "budget_exhausted") }
	first := 0
	for ask() {
		if first++; first > 20 {
			t.Fatal("more than 20 requests of ~25 units admitted at once; want east held to its floor of 100 units while the window's table learns")
		}
	}
	if first == 0 {
		t.Fatal("no request admitted: want the floor's 100 units spent first")
	}
	eventually.True(t, wait, "east's allowance grows with its demand and admits the tenant again", ask)
	_, metrics := get(t, "http://"+s.HTTPAddr().String()+"/metrics")
	share := regexp.MustCompile(`(?m)^hedgerow_lease_share\{kind="tenant_spend",region="east"\} (\S+)$`).FindSubmatch(metrics)
	if share == nil {
		t.Fatalf("no hedgerow_lease_share of tenant_spend for east in\n%s", metrics)
	}
	if v, _ := strconv.ParseFloat(string(share[1]), 64); !(v > 0.05) {
		t.Fatalf("east's tenant_spend share is %v; want it grown past the floor 0.05", v)
	}
}

// askAs sends a chat completion to s as the tenant holding key and reports
// whether it was answered; any answer but 200 or a 429 naming refusal fails t.
func askAs(t *testing.T, s *Serve, key, refusal string) bool {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+s.HTTPAddr().String()+"/v1/chat/completions",
		strings.NewReader(`{"model":"general","max_tokens":20,"messages":[{"role":"user","content":"hello"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	switch status, body := do(t, req); {
	case status == http.StatusOK:
		return true
	case status != http.StatusTooManyRequests || !strings.Contains(string(body), refusal):
		t.Fatalf("%d %s; want 200 or 429 %s", status, body, refusal)
	}
	return false
}
