package integration

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hedgerow/hedgerow/budgets/redisstore"
	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/internal/redistest"
)

// TestTwoGatewayProcessesShareOneRedis runs two `hedgerow gateway` processes
// configured with one redis.url and one hash key, a worker process and a
// nats-server process. A user action (one Idempotency-Key) answered by the
// first gateway is replayed by the second: the winner gate, the attempt
// ledger, the user action's id and the committed answers are shared
// through Redis.
func TestTwoGatewayProcessesShareOneRedis(t *testing.T) {
	ps := startProcesses(t, processOptions{gateways: 2, firstByte: 10 * time.Millisecond, redis: true})
	p, rs, gateways := ps.provider, ps.redis, ps.gateways

	send := chatSender(t)
	chat := func(gateway, key string) (*http.Response, string) {
		t.Helper()
		resp, body, err := send(gateway, key)
		if err != nil {
			t.Fatal(err)
		}
		return resp, body
	}

	// The provider holds the first attempt: meanwhile the worker process
	// has a lease on route a in Redis, where every gateway's route choice
	// reads the route's load, and gives it back once the attempt ends.
	release := p.hold(1)
	type answer struct {
		resp *http.Response
		body string
		err  error
	}
	answered := make(chan answer, 1)
	go func() {
		resp, body, err := send(gateways[0], "order-42")
		answered <- answer{resp, body, err}
	}()
	select {
	case <-p.held:
	case <-time.After(15 * time.Second):
		t.Fatal("the first request never reached the provider")
	}
	leases := leaseCounter(t, rs, "procs")
	eventually.True(t, 15*time.Second, "the worker process's lease on route a", func() bool { return leases("a") == 1 })
	release()
	a := <-answered
	if a.err != nil {
		t.Fatal(a.err)
	}
	first, body := a.resp, a.body
	eventually.True(t, 15*time.Second, "the lease on route a to be given back", func() bool { return leases("a") == 0 })
	if first.StatusCode != http.StatusOK {
		t.Fatalf("first gateway: %d %s", first.StatusCode, body)
	}
	gate := first.Header.Get(frontdoor.HeaderGate)
	if gate == "" {
		t.Fatalf("first gateway's answer carries no %s header", frontdoor.HeaderGate)
	}
	held, err := rs.Client().Keys(t.Context(), "procs:*:win").Result()
	if err != nil || len(held) != 1 {
		t.Fatalf("winner keys in redis: %q, %v; want one", held, err)
	}
	if v, err := rs.Client().Get(t.Context(), held[0]).Result(); err != nil || v != gate {
		t.Fatalf("redis holds %q (%v), the answer's gate value is %q", v, err, gate)
	}

	// The committed answer is in Redis too: the second gateway replays it
	// byte for byte (a new group would have lost the gate: 409).
	second, replayed := chat(gateways[1], "order-42")
	if second.StatusCode != http.StatusOK || replayed != body || second.Header.Get(frontdoor.HeaderGate) != gate ||
		second.Header.Get(frontdoor.HeaderIdempotentReplayed) != "true" {
		t.Fatalf("second gateway, same user action: %d %s (gate %q, replayed %q); want the first answer replayed",
			second.StatusCode, replayed, second.Header.Get(frontdoor.HeaderGate), second.Header.Get(frontdoor.HeaderIdempotentReplayed))
	}
	other, body := chat(gateways[1], "order-43")
	if other.StatusCode != http.StatusOK {
		t.Fatalf("second gateway, another user action: %d %s", other.StatusCode, body)
	}
}

// TestTwoGatewayProcessesNeverCommitAUserActionTwiceThroughARedisOutage
// sends each user action to both gateway processes at once — twice to
// each — while Redis is stopped, then, after Redis restarts empty, retries
// every one of them on both and sends as many new ones. Every answer of a
// user action carries the same gate value: it committed once, and retries
// got that answer replayed, already_committed, or budget_exhausted once
// its attempt ledger was spent.
func TestTwoGatewayProcessesNeverCommitAUserActionTwiceThroughARedisOutage(t *testing.T) {
	s := startReplicas(t, 0)
	type keyed struct {
		key string
		answer
	}
	var answers []keyed
	burst := func(keys []string, perGateway int) {
		out := make(chan keyed, len(keys)*perGateway*len(s.gateways))
		sem := make(chan struct{}, 16)
		for _, key := range keys {
			for i := range perGateway * len(s.gateways) {
				go func() {
					sem <- struct{}{}
					defer func() { <-sem }()
					out <- keyed{key, s.send(s.gateways[i%len(s.gateways)], key)}
				}()
			}
		}
		for range cap(out) {
			answers = append(answers, <-out)
		}
	}
	keysOf := func(phase string, n int) []string {
		var keys []string
		for i := range n {
			keys = append(keys, fmt.Sprintf("%s-%d", phase, i))
		}
		return keys
	}
	const perPhase = 40
	s.redis.Kill()
	down := keysOf("down", perPhase)
	burst(down, 2)
	s.redis.Restart()
	burst(append(down, keysOf("restarted", perPhase)...), 2)

	gates := map[string]map[string]bool{}
	statuses := map[int]int{}
	for _, a := range answers {
		if a.err != nil {
			t.Fatalf("%s: %v", a.key, a.err)
		}
		statuses[a.status]++
		switch a.status {
		case http.StatusOK:
			if gates[a.key] == nil {
				gates[a.key] = map[string]bool{}
			}
			gates[a.key][a.header.Get(frontdoor.HeaderGate)] = true
		case http.StatusConflict:
		case http.StatusTooManyRequests:
			// The user action's attempt ledger caps attempts across its
			// groups and retries (max_attempts 3): a refusal, no commit.
			if !strings.Contains(a.body, `"budget_exhausted"`) {
				t.Errorf("%s answered 429 %s; want budget_exhausted", a.key, a.body)
			}
		default:
			t.Errorf("%s answered %d %s; want 200, 409 or 429", a.key, a.status, a.body)
		}
	}
	t.Logf("answers by status: %v", statuses)
	for _, key := range append(down, keysOf("restarted", perPhase)...) {
		if n := len(gates[key]); n != 1 {
			t.Errorf("user action %s committed %d times (gate values %v), want once", key, n, gates[key])
		}
	}
}

// leaseCounter counts the live route leases under prefix in rs, as a
// gateway's route refresh does; -1 when Redis does not answer.
func leaseCounter(t *testing.T, rs *redistest.Server, prefix string) func(route string) int {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: rs.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	store, err := redisstore.New(c, redisstore.Options{Prefix: prefix, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return func(route string) int {
		n, err := store.InFlight(t.Context(), []string{route})
		if err != nil {
			return -1
		}
		return n[route]
	}
}
