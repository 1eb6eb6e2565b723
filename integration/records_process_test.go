package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/internal/adapters/records"
	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/internal/natstest"
	"github.com/hedgerow/hedgerow/schemas"
)

// TestEveryAnsweredGroupIsInTheRecordsStreamAfterAGatewayIsKilled runs two
// gateway processes (budgets and gates of their own: no Redis) and a worker
// process on a nats-server process with JetStream, under load; kills one
// with SIGKILL mid-load, then kills
// and restarts the nats-server process on its JetStream store: every group
// either gateway answered with a 200 has its record in the records stream
// (docs/architecture.md §9: a committed group's record is kept before its
// answer leaves).
func TestEveryAnsweredGroupIsInTheRecordsStreamAfterAGatewayIsKilled(t *testing.T) {
	ps := startProcesses(t, processOptions{gateways: 2, firstByte: 20 * time.Millisecond})
	answered, killedAnswered := loadAndKill(t, ps.gateways, chatSender(t), func() { ps.procs[0].kill(t) })
	// The stream outlives its server's SIGKILL too: restart nats-server on
	// the same store and read every answered group there.
	missing := checkKept(t, ps.restartNATS(t), answered)
	t.Logf("%d groups answered (%d by the killed gateway before its SIGKILL), %d missing from the stream",
		len(answered), killedAnswered, missing)
}

// TestEveryAnsweredGroupIsInServesStoreAfterServeIsKilled kills a `serve`
// process with SIGKILL mid-load; a NATS server started on its
// nats.store_dir finds every group serve answered with a 200 in the
// records stream.
func TestEveryAnsweredGroupIsInServesStoreAfterServeIsKilled(t *testing.T) {
	bins := buildBinaries(t)
	dir := t.TempDir()
	p := newProvider(t, 20*time.Millisecond)
	store := filepath.Join(dir, "store")
	addr := freeAddr(t)
	y := fmt.Sprintf(processConfigYAML, "nats://127.0.0.1:1", addr, p.baseURL("serve"), processDeadline)
	y = strings.Replace(y, "nats:\n", "nats:\n  store_dir: "+store+"\n", 1)
	cfgPath := filepath.Join(dir, "serve.yaml")
	if err := os.WriteFile(cfgPath, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	serve := startProcess(t, dir, "serve", bins.hedgerow, "serve", "--config", cfgPath)
	base := "http://" + addr
	waitReady(t, base)
	answered, killedAnswered := loadAndKill(t, []string{base}, chatSender(t), func() { serve.kill(t) })
	srv := natstest.Start(t, natstest.JetStream(store))
	missing := checkKept(t, natstest.Connect(t, srv), answered)
	t.Logf("%d groups answered by serve before its SIGKILL, %d missing from the stream", killedAnswered, missing)
}

// chatSender posts a chat completion naming an Idempotency-Key to a
// gateway and reads its answer; safe for concurrent use.
func chatSender(t *testing.T) func(gateway, key string) (*http.Response, string, error) {
	client := &http.Client{Timeout: processDeadline + 10*time.Second}
	t.Cleanup(client.CloseIdleConnections)
	return func(gateway, key string) (*http.Response, string, error) {
		req, err := http.NewRequest(http.MethodPost, gateway+"/v1/chat/completions",
			strings.NewReader(`{"model":"general","messages":[{"role":"user","content":"hello"}],"max_tokens":50}`))
		if err != nil {
			return nil, "", err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(frontdoor.HeaderIdempotencyKey, key)
		resp, err := client.Do(req)
		if err != nil {
			return nil, "", fmt.Errorf("POST %s: %w", gateway, err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp, string(body), err
	}
}

// loadAndKill sends perGateway requests to each gateway, senders at a time
// per gateway, and calls kill once the first gateway answered killAfter of
// them. It returns every group answered 200 (group → key) and how many the
// first gateway answered.
func loadAndKill(t *testing.T, gateways []string, send func(gateway, key string) (*http.Response, string, error),
	kill func()) (map[string]string, int) {
	t.Helper()
	const perGateway, senders, killAfter = 150, 8, 40
	var mu sync.Mutex
	answered := map[string]string{}
	firstAnswered := 0
	killNow := make(chan struct{})
	var killOnce sync.Once
	var wg sync.WaitGroup
	for gi, gw := range gateways {
		work := make(chan string)
		for range senders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for key := range work {
					resp, _, err := send(gw, key)
					if err != nil || resp.StatusCode != http.StatusOK {
						continue // the killed process's requests in flight, and any after
					}
					gv, err := arbiter.ParseGateValue(resp.Header.Get(frontdoor.HeaderGate))
					if err != nil {
						t.Errorf("%s answered 200 with gate %q: %v", key, resp.Header.Get(frontdoor.HeaderGate), err)
						continue
					}
					mu.Lock()
					answered[gv.Group] = key
					if gi == 0 {
						firstAnswered++
						if firstAnswered == killAfter {
							killOnce.Do(func() { close(killNow) })
						}
					}
					mu.Unlock()
				}
			}()
		}
		go func() {
			defer close(work)
			for i := range perGateway {
				work <- fmt.Sprintf("rec-%d-%d", gi, i)
			}
		}()
	}
	select {
	case <-killNow:
	case <-time.After(60 * time.Second):
		t.Fatal("the first gateway never answered enough to be killed mid-load")
	}
	kill() // SIGKILL, with requests in flight
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if firstAnswered >= perGateway {
		t.Fatalf("the killed process answered all %d requests: it was not killed mid-load", perGateway)
	}
	return answered, firstAnswered
}

// checkKept asserts every answered group has a committed record in the
// records stream nc reaches, and returns how many do not.
func checkKept(t *testing.T, nc *nats.Conn, answered map[string]string) int {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	eventually.True(t, 30*time.Second, "the records stream after the restart", func() bool {
		_, err = js.Stream(ctx, records.DefaultStream)
		return err == nil
	})
	// Read as every reader reads them: batches split, each subject's latest.
	kept, err := records.Reader{JS: js, Stream: records.DefaultStream}.Kept(ctx, time.Time{})
	if err != nil {
		t.Fatalf("reading the records stream: %v", err)
	}
	last := map[string][]byte{}
	for _, k := range kept {
		last[k.Subject] = k.Data
	}
	missing := 0
	for group, key := range answered {
		data, ok := last[schemas.StoredGroupSubject(group)]
		if !ok {
			missing++
			t.Errorf("answered group %s (%s) has no record in the stream", group, key)
			continue
		}
		var r schemas.GroupRecord
		if err := json.Unmarshal(data, &r); err != nil || r.HedgeGroupID != group || r.Outcome != schemas.GroupCommitted {
			t.Errorf("group %s: record %s (%v)", group, data, err)
		}
	}
	return missing
}
