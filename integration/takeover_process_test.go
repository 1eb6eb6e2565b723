package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/internal/adapters/records"
	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/report"
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

// TestAfterGatewayTakeoversTheReportCountsOneCommitPerUserActionAndTheSupersededApart
// holds three committed streams of gateway 1 mid-answer, kills it with
// SIGKILL and retries each user action on gateway 2, whose takeovers
// supersede the dead gateway's commits (docs/architecture.md §2). The
// records stream then holds both commits of each user action — the dead
// one's usage was paid — and a superseded record linking them; `hedgerow
// report --nats` (the records.Reader, read by the command itself) counts
// one committed group per user action, none committed twice, and the three
// superseded apart.
func TestAfterGatewayTakeoversTheReportCountsOneCommitPerUserActionAndTheSupersededApart(t *testing.T) {
	const takeovers = 3
	s := startReplicas(t, 10*time.Millisecond)
	release := s.provider.holdMidStream(takeovers)
	defer release()

	dead := map[string]arbiter.GateValue{} // key → the dead gateway's commit
	for i := range takeovers {
		key := fmt.Sprintf("order-takeover-%d", i)
		req, err := s.streamRequest(s.gateways[0], key)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := s.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("gateway 1, %s: %d", key, resp.StatusCode)
		}
		if dead[key], err = arbiter.ParseGateValue(resp.Header.Get(frontdoor.HeaderGate)); err != nil {
			t.Fatalf("gateway 1's stream of %s carries no gate value: %v", key, err)
		}
		// The caller has the first word: the stream is committed and cut here.
		events := bufio.NewReader(resp.Body)
		for {
			line, err := events.ReadString('\n')
			if err != nil {
				t.Fatalf("gateway 1's stream of %s ended before its first word: %q, %v", key, line, err)
			}
			if strings.Contains(line, `"content":"answer"`) {
				break
			}
		}
	}
	for range takeovers {
		select {
		case <-s.provider.held:
		case <-time.After(10 * time.Second):
			t.Fatal("the provider never held every stream")
		}
	}
	s.procs[0].kill(t)
	release() // the dead gateway's worker finishes into the void

	retries := map[string]answer{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for key := range dead {
		wg.Go(func() {
			a := s.send(s.gateways[1], key)
			mu.Lock()
			retries[key] = a
			mu.Unlock()
		})
	}
	wg.Wait()
	taker := map[string]string{} // the dead gateway's group → the takeover's
	for key, a := range retries {
		gate, err := arbiter.ParseGateValue(a.header.Get(frontdoor.HeaderGate))
		if a.err != nil || a.status != http.StatusOK || !complete(a.body) || err != nil || gate.Epoch <= dead[key].Epoch {
			t.Fatalf("the retry of %s on gateway 2: %d %q (gate %q) %v; want a complete 200 stream after epoch %d",
				key, a.status, a.body, a.header.Get(frontdoor.HeaderGate), a.err, dead[key].Epoch)
		}
		taker[dead[key].Group] = gate.Group
	}

	// What `hedgerow report --nats` prints, from the command itself.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, s.bins.hedgerow, "report", "--nats", s.natsURL, "--json").Output()
	if err != nil {
		var stderr []byte
		if ee, ok := errors.AsType[*exec.ExitError](err); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("hedgerow report --nats: %v\n%s", err, stderr)
	}
	var rep report.Report
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("hedgerow report --json printed %q: %v", out, err)
	}
	tot := rep.Total
	if rep.UserActions != takeovers || rep.CommittedTwice != 0 || tot.Groups != 2*takeovers ||
		tot.CommittedGroups != takeovers || tot.SupersededGroups != takeovers || tot.FailedGroups != 0 {
		t.Fatalf("hedgerow report: %d user actions (%d committed twice), groups %d: committed %d, superseded %d, failed %d; "+
			"want %d user actions, none committed twice, and of %d groups %d committed and %d superseded",
			rep.UserActions, rep.CommittedTwice, tot.Groups, tot.CommittedGroups, tot.SupersededGroups, tot.FailedGroups,
			takeovers, 2*takeovers, takeovers, takeovers)
	}

	// The records that say so, through the same reader.
	js, err := jetstream.New(s.nc)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := records.Reader{JS: js, Stream: records.DefaultStream}.Records(ctx, time.Time{})
	if err != nil {
		t.Fatalf("read the records stream: %v", err)
	}
	if len(recs.Superseded) != takeovers {
		t.Fatalf("%d superseded records, want %d: %+v", len(recs.Superseded), takeovers, recs.Superseded)
	}
	for _, sr := range recs.Superseded {
		var orphan arbiter.GateValue
		for _, gv := range dead {
			if gv.Group == sr.HedgeGroupID {
				orphan = gv
			}
		}
		if orphan.Group == "" || sr.SupersededBy != taker[orphan.Group] || sr.GateEpoch != orphan.Epoch || sr.WinnerAttempt != orphan.Attempt {
			t.Errorf("superseded record %+v; want one naming a dead commit, its epoch and attempt, and its takeover", sr)
		}
	}
	named := 0
	for _, g := range recs.Groups {
		switch {
		case g.Supersedes == "":
		case taker[g.Supersedes] != g.HedgeGroupID:
			t.Errorf("group %s names %q superseded; the takeovers were %v (dead group → takeover)", g.HedgeGroupID, g.Supersedes, taker)
		default:
			named++
		}
	}
	if named != takeovers {
		t.Errorf("%d takeovers' group records name the commit they superseded, want %d", named, takeovers)
	}
	t.Logf("%d takeovers: %d committed, %d superseded, %d committed twice", takeovers, tot.CommittedGroups, tot.SupersededGroups, rep.CommittedTwice)
}
