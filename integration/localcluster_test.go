package integration

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/internal/adapters/records"
	"github.com/hedgerow/hedgerow/internal/natsauth"
	"github.com/hedgerow/hedgerow/internal/tools/cluster"
	"github.com/hedgerow/hedgerow/schemas"
)

// TestLocalClusterAnswersAndKeepsItsRecordThenStopsEverything is the smoke
// test of `make cluster` (internal/tools/cluster): a small variant — one NATS
// node with TLS and the generated users, Redis, the three routes, one
// worker, one gateway, no Prometheus — on free ports in a temporary
// directory. One request is answered, its group's record is kept in the
// records stream (read as the observer user), and Down leaves no process
// running and no port listened on.
func TestLocalClusterAnswersAndKeepsItsRecordThenStopsEverything(t *testing.T) {
	bins := buildBinaries(t)
	redisServer := redisServerBinary(t)
	ports, err := cluster.FreePorts(1, 1, 1, false)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	spec := cluster.Spec{Dir: dir, Hedgerow: bins.hedgerow, NATSServer: bins.natsServer, RedisServer: redisServer,
		Workers: 1, Gateways: 1, Ports: ports, TimeScale: 0.2}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var out strings.Builder
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = cluster.Down(dir, io.Discard)
		}
	})
	if err := cluster.Up(ctx, spec, &out); err != nil {
		t.Fatalf("cluster up: %v\n%s", err, out.String())
	}
	m, err := cluster.ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range m.Parts {
		if !p.Running() {
			t.Errorf("%s is not running after up", p.Name)
		}
		if pid := readPid(t, cluster.PidFile(dir, p.Name)); pid != p.Pid {
			t.Errorf("%s: pid file says %d, manifest %d", p.Name, pid, p.Pid)
		}
	}

	header := askLocal(ctx, t, m.GatewayURL(0), "smoke-1")
	gv, err := arbiter.ParseGateValue(header.Get(frontdoor.HeaderGate))
	if err != nil {
		t.Fatalf("answer's gate %q: %v", header.Get(frontdoor.HeaderGate), err)
	}

	nc, err := m.Connect(natsauth.UserObserver)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	data, found, err := records.Reader{JS: js, Stream: records.DefaultStream}.Last(ctx, schemas.StoredGroupSubject(gv.Group))
	if err != nil || !found {
		t.Fatalf("the answered group %s has no record: %v", gv.Group, err)
	}
	var rec schemas.GroupRecord
	if err := json.Unmarshal(data, &rec); err != nil || rec.HedgeGroupID != gv.Group || rec.Outcome != schemas.GroupCommitted {
		t.Fatalf("group record %s (%v); want committed group %s", data, err, gv.Group)
	}
	nc.Close()

	if err := cluster.Down(dir, io.Discard); err != nil {
		t.Fatalf("cluster down: %v", err)
	}
	stopped = true
	for _, p := range m.Parts {
		if p.Running() {
			t.Errorf("%s (pid %d) still runs after down", p.Name, p.Pid)
		}
	}
	for _, port := range []int{ports.NATS[0], ports.Redis, ports.Gateways[0], ports.RedisProxy} {
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			t.Errorf("port %d still taken after down: %v", port, err)
			continue
		}
		ln.Close()
	}
}

// redisServerBinary is redis-server from PATH; the test fails without it.
func redisServerBinary(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal("redis-server is needed (make redis installs it):", err)
	}
	return path
}

// askLocal sends one small chat completion with an Idempotency-Key to a
// local deployment's gateway at base as its tenant, fails the test unless
// it is answered 200, and returns the answer's headers.
func askLocal(ctx context.Context, t *testing.T, base, key string) http.Header {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions",
		strings.NewReader(`{"model":"general","messages":[{"role":"user","content":"hello"}],"max_tokens":8}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+cluster.TenantKey)
	req.Header.Set(frontdoor.HeaderIdempotencyKey, key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", base, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: POST /v1/chat/completions: %d %s", base, resp.StatusCode, body)
	}
	return resp.Header
}

func readPid(t *testing.T, path string) int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return pid
}
