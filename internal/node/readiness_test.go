package node

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/hedgerow/hedgerow/frontdoor/httpdoor"
	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/internal/natstest"
)

// twoPoolsConfig is a gateway's configuration of two pools of one route
// each, "chat" on fake-a and "other" on fake-b, on the NATS server at url.
func twoPoolsConfig(t *testing.T, url, urlA, urlB string) *config.Config {
	t.Helper()
	y := fmt.Sprintf(`nats:
  urls: [%q]
http:
  listen: 127.0.0.1:0
routes:
  - {name: fake-a, provider: openai, base_url: %q, model: m}
  - {name: fake-b, provider: openai, base_url: %q, model: m}
pools:
  chat: {routes: [fake-a]}
  other: {routes: [fake-b]}
policies:
  default: {control_fraction: 0, deadline: 5s, heartbeat_interval: 50ms}
`, url, urlA, urlB)
	cfg, err := config.Parse("gateway.yaml", []byte(y), config.RoleGateway, os.LookupEnv)
	if err != nil {
		t.Fatalf("config: %v\n%s", err, y)
	}
	return cfg
}

// gatewayStatus is what the test reads of the status endpoint.
type gatewayStatus struct {
	Ready               bool                `json:"ready"`
	PoolsWithoutWorkers map[string][]string `json:"pools_without_workers"`
}

func readStatus(t *testing.T, base string) gatewayStatus {
	t.Helper()
	code, body := get(t, base+httpdoor.StatusPath)
	var st gatewayStatus
	if err := json.Unmarshal(body, &st); err != nil || code != http.StatusOK {
		t.Fatalf("status %d %s: %v", code, body, err)
	}
	return st
}

func postPool(t *testing.T, base, pool string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions",
		strings.NewReader(`{"model":"`+pool+`","messages":[{"role":"user","content":"hello"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	return do(t, req)
}

// TestAPoolWhoseWorkersAreGoneLeavesTheGatewayReadyAndAnswers503NamingIt:
// a gateway and a worker process per pool on a real NATS server. With
// pool other's worker stopped, /readyz stays 200 (one dark pool must not
// pull every gateway out of the Service), the status endpoint and
// hedgerow_pool_without_workers name other, pool chat still answers, and a
// request to other is a 503 no_workers naming its pool.
func TestAPoolWhoseWorkersAreGoneLeavesTheGatewayReadyAndAnswers503NamingIt(t *testing.T) {
	ns := natstest.Start(t, natstest.MaxPayload(16<<20))
	cfg := twoPoolsConfig(t, ns.ClientURL(), fakeRoute(t, 0), fakeRoute(t, 1))
	g, err := StartGateway(cfg, natstest.Connect(t, ns, nats.Name("gateway")), nil, Options{})
	if err != nil {
		t.Fatalf("StartGateway: %v", err)
	}
	defer stop(t, g)
	workersA, err := StartWorkers(cfg, natstest.Connect(t, ns, nats.Name("workers-a")), Options{Routes: []string{"fake-a"}})
	if err != nil {
		t.Fatalf("StartWorkers fake-a: %v", err)
	}
	defer stop(t, workersA)
	workersB, err := StartWorkers(cfg, natstest.Connect(t, ns, nats.Name("workers-b")), Options{Routes: []string{"fake-b"}})
	if err != nil {
		t.Fatalf("StartWorkers fake-b: %v", err)
	}
	base := "http://" + g.Addr().String()
	eventually.True(t, wait, "both pools to have a live worker", func() bool {
		return len(readStatus(t, base).PoolsWithoutWorkers) == 0
	})
	for _, pool := range []string{"chat", "other"} {
		if code, body := postPool(t, base, pool); code != http.StatusOK {
			t.Fatalf("pool %s with its worker: %d %s", pool, code, body)
		}
	}

	stop(t, workersB)
	eventually.True(t, wait, "pool other to be reported without workers", func() bool {
		_, dark := readStatus(t, base).PoolsWithoutWorkers["other"]
		return dark
	})
	if st := readStatus(t, base); !st.Ready || len(st.PoolsWithoutWorkers) != 1 {
		t.Fatalf("status %+v, want ready with only pool other without workers", st)
	}
	if code, body := get(t, base+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz with pool other dark: %d %s, want 200", code, body)
	}
	_, metrics := get(t, base+"/metrics")
	for _, line := range []string{`hedgerow_pool_without_workers{pool="other"} 1`, `hedgerow_pool_without_workers{pool="chat"} 0`} {
		if !strings.Contains(string(metrics), line) {
			t.Errorf("/metrics lacks %s", line)
		}
	}
	if code, body := postPool(t, base, "chat"); code != http.StatusOK {
		t.Fatalf("pool chat beside a dark pool: %d %s", code, body)
	}
	code, body := postPool(t, base, "other")
	var e struct {
		Error struct{ Message, Type, Code, Param string }
	}
	if err := json.Unmarshal(body, &e); err != nil || code != http.StatusServiceUnavailable ||
		e.Error.Code != "no_workers" || e.Error.Param != "model" || !strings.Contains(e.Error.Message, "'other'") {
		t.Fatalf("pool other without workers: %d %s, want 503 no_workers naming the pool", code, body)
	}
}

// TestServeIsReadyOnlyWhileItsOwnWorkersAnswer: serve's gateway is ready
// with its in-process workers registered, and not once they are gone.
func TestServeIsReadyOnlyWhileItsOwnWorkersAnswer(t *testing.T) {
	s, err := StartServe(parse(t, fakeRoute(t, 0), fakeRoute(t, 1), ""), Options{})
	if err != nil {
		t.Fatalf("StartServe: %v", err)
	}
	defer stop(t, s)
	base := "http://" + s.HTTPAddr().String()
	if code, body := get(t, base+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz of a started serve: %d %s", code, body)
	}
	stop(t, s.workers)
	var body []byte
	eventually.True(t, wait, "serve's /readyz to fail without its workers", func() bool {
		var code int
		code, body = get(t, base+"/readyz")
		return code == http.StatusServiceUnavailable
	})
	var rep struct {
		Missing []string `json:"own_workers_missing"`
	}
	if err := json.Unmarshal(body, &rep); err != nil || fmt.Sprint(rep.Missing) != "[fake-a fake-b]" {
		t.Fatalf("/readyz %s, want its own workers fake-a and fake-b named missing", body)
	}
}
