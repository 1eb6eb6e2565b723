package integration

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/internal/eventually"
)

// replicaLease is the in-flight lease of the replicas' requests
// (http.idempotency.lease): a retry takes over a request whose gateway
// stopped refreshing it this long ago.
const replicaLease = time.Second

// replicaSystem is nats-server, one worker process, two gateway processes
// sharing one Redis, and the provider the worker calls.
type replicaSystem struct {
	*processes
	client *http.Client
}

// startReplicas starts the replica system and returns once both gateways
// are ready.
func startReplicas(t *testing.T, firstByte time.Duration) *replicaSystem {
	t.Helper()
	return startReplicasWith(t, firstByte, 0)
}

// startReplicasWith is startReplicas with the policy's max_attempts (0:
// the harness's 3).
func startReplicasWith(t *testing.T, firstByte time.Duration, maxAttempts int) *replicaSystem {
	t.Helper()
	s := &replicaSystem{
		processes: startProcesses(t, processOptions{gateways: 2, firstByte: firstByte, redis: true, lease: replicaLease, debug: true,
			maxAttempts: maxAttempts}),
		client: &http.Client{Timeout: processDeadline + 10*time.Second},
	}
	t.Cleanup(s.client.CloseIdleConnections)
	return s
}

// streamRequest is a streaming chat completion naming key.
func (s *replicaSystem) streamRequest(gateway, key string) (*http.Request, error) {
	req, err := http.NewRequest(http.MethodPost, gateway+"/v1/chat/completions",
		strings.NewReader(`{"model":"general","messages":[{"role":"user","content":"hello"}],"max_tokens":50,"stream":true}`))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(frontdoor.HeaderIdempotencyKey, key)
	return req, nil
}

// answer is one gateway's whole answer.
type answer struct {
	status int
	header http.Header
	body   string
	err    error
}

// send posts a streaming chat completion naming key and reads its whole
// answer; safe to call from any goroutine.
func (s *replicaSystem) send(gateway, key string) answer {
	req, err := s.streamRequest(gateway, key)
	if err != nil {
		return answer{err: err}
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return answer{err: fmt.Errorf("POST %s: %w", gateway, err)}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: string(body), err: err}
}

// complete says whether body is a whole stream of the worker's answer.
func complete(body string) bool {
	var content strings.Builder
	for line := range strings.Lines(body) {
		if i := strings.Index(line, `"content":"`); i >= 0 {
			rest := line[i+len(`"content":"`):]
			content.WriteString(rest[:strings.IndexByte(rest, '"')])
		}
	}
	return content.String() == answerFrom("worker") && strings.HasSuffix(body, "data: [DONE]\n\n")
}

// TestRetryAfterAGatewayProcessIsKilledMidStreamGetsACompleteAnswer kills
// gateway 1 with SIGKILL while its caller's stream is committed and half
// written. The retry with the same Idempotency-Key on gateway 2 finds the
// dead gateway's in-flight lease, waits for it to lapse, takes the request
// over (superseding the dead gateway's commit in the winner gate) and
// answers a complete 200 stream — regenerated, since the bytes after the
// crash existed nowhere durable (docs/architecture.md §2). A later retry
// is replayed that answer byte for byte with no provider call. The policy
// allows one attempt per user action, all of which the dead gateway's group
// spent: the takeover is admitted because that group's ledger slot is
// forgiven (§7), not refused 429 budget_exhausted.
func TestRetryAfterAGatewayProcessIsKilledMidStreamGetsACompleteAnswer(t *testing.T) {
	s := startReplicasWith(t, 10*time.Millisecond, 1)
	release := s.provider.holdMidStream(1)
	defer release()

	req, err := s.streamRequest(s.gateways[0], "order-killed")
	if err != nil {
		t.Fatal(err)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("gateway 1: %d", resp.StatusCode)
	}
	deadGate, err := arbiter.ParseGateValue(resp.Header.Get(frontdoor.HeaderGate))
	if err != nil {
		t.Fatalf("gateway 1's stream carries no gate value in its headers: %v", err)
	}
	// The caller has the first word: the stream is committed and cut here.
	events := bufio.NewReader(resp.Body)
	for {
		line, err := events.ReadString('\n')
		if err != nil {
			t.Fatalf("gateway 1's stream ended before its first word: %q, %v", line, err)
		}
		if strings.Contains(line, `"content":"answer"`) {
			break
		}
	}
	select {
	case <-s.provider.held:
	case <-time.After(10 * time.Second):
		t.Fatal("the provider never held the stream")
	}
	s.procs[0].kill(t)
	killed := time.Now()
	release() // the dead gateway's worker finishes into the void

	retry := s.send(s.gateways[1], "order-killed")
	took := time.Since(killed)
	if retry.err != nil || retry.status != http.StatusOK || !complete(retry.body) {
		t.Fatalf("the retry on gateway 2: %d %q %v; want a complete 200 stream", retry.status, retry.body, retry.err)
	}
	gate, err := arbiter.ParseGateValue(retry.header.Get(frontdoor.HeaderGate))
	if err != nil || gate.Epoch <= deadGate.Epoch || gate.Group == deadGate.Group {
		t.Fatalf("the retry's gate value %q; want a new group at an epoch after the dead gateway's %s", retry.header.Get(frontdoor.HeaderGate), deadGate)
	}
	if retry.header.Get(frontdoor.HeaderIdempotentReplayed) != "" {
		t.Fatal("the retry is marked replayed; it was regenerated")
	}
	t.Logf("kill → the retry's complete answer: %v (lease %v)", took.Round(time.Millisecond), replicaLease)

	again := s.send(s.gateways[1], "order-killed")
	if again.err != nil || again.status != http.StatusOK || again.body != retry.body ||
		again.header.Get(frontdoor.HeaderIdempotentReplayed) != "true" {
		t.Fatalf("a later retry: %d %q (replayed %q) %v; want the retry's answer replayed", again.status, again.body,
			again.header.Get(frontdoor.HeaderIdempotentReplayed), again.err)
	}
	if n := s.provider.requests(); n != 2 {
		t.Fatalf("the provider had %d requests; want 2 (the dead gateway's and the takeover's)", n)
	}
}

// TestTwinsOnBothGatewayProcessesShareOneProviderCall sends the same
// streaming request under one Idempotency-Key to both gateway processes at
// once: one of them runs it, the other waits on its in-flight lease in
// Redis and replays its answer. The provider is called once and both
// callers get the same bytes.
func TestTwinsOnBothGatewayProcessesShareOneProviderCall(t *testing.T) {
	s := startReplicas(t, 10*time.Millisecond)
	release := s.provider.hold(1)
	defer release()
	answers := make([]answer, 2)
	var wg sync.WaitGroup
	wg.Go(func() { answers[0] = s.send(s.gateways[0], "order-twins") })
	select {
	case <-s.provider.held:
	case <-time.After(10 * time.Second):
		t.Fatal("the first request never reached the provider")
	}
	// The first request holds the lease while the provider holds it.
	eventually.True(t, 10*time.Second, "gateway 1's in-flight lease in Redis", func() bool {
		keys, err := s.redis.Client().Keys(t.Context(), "procs:{rp:*}:lease").Result()
		return err == nil && len(keys) == 1
	})
	wg.Go(func() { answers[1] = s.send(s.gateways[1], "order-twins") })
	release()
	wg.Wait()
	for i, a := range answers {
		if a.err != nil || a.status != http.StatusOK || !complete(a.body) {
			t.Fatalf("gateway %d: %d %q %v; want a complete 200 stream", i+1, a.status, a.body, a.err)
		}
	}
	if answers[0].body != answers[1].body || answers[1].header.Get(frontdoor.HeaderIdempotentReplayed) != "true" {
		t.Fatalf("gateway 2's answer %q (replayed %q); want gateway 1's %q replayed", answers[1].body,
			answers[1].header.Get(frontdoor.HeaderIdempotentReplayed), answers[0].body)
	}
	if n := s.provider.requests(); n != 1 {
		t.Fatalf("the provider had %d requests; want 1", n)
	}
}
