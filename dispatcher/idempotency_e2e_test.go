package dispatcher_test

// Idempotency-Key through the HTTP door in front of the real runtime
// (docs/architecture.md §2): a retry after a commit and a twin in flight
// get the committed answer, and the provider hears of the user action
// once. The door's own tests (frontdoor/httpdoor) pin the join order with
// a scripted Submitter; here the provider's requests are counted.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/hedgerow/hedgerow/arbiter/sharedgate"
	"github.com/hedgerow/hedgerow/budgets/redisstore"
	"github.com/hedgerow/hedgerow/dispatcher"
	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/frontdoor/frontdoortest"
	"github.com/hedgerow/hedgerow/frontdoor/httpdoor"
	"github.com/hedgerow/hedgerow/frontdoor/replay"
	"github.com/hedgerow/hedgerow/frontdoor/replay/redisreplay"
	"github.com/hedgerow/hedgerow/internal/redistest"
)

// replayingDoor is the HTTP door of a one-route cluster (no hedge to
// count) whose provider answers after firstByte, with a memory replay
// store.
func replayingDoor(t *testing.T, firstByte time.Duration) (string, *dispatcher.TestProvider) {
	t.Helper()
	p := dispatcher.NewTestProvider(t, "a", dispatcher.NewTestScript(dispatcher.Late(firstByte, 3)))
	c := dispatcher.NewTestCluster(t, []string{"a"}, map[string]*dispatcher.TestProvider{"a": p}, "")
	store, err := replay.NewMemory(replay.MemoryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return httpDoor(t, c, c.Dispatcher(), httpdoor.Options{Replays: store}).URL, p
}

func readAll(t *testing.T, resp *http.Response) []byte {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestHTTPRetryAfterCommitReplaysWithoutAProviderCall(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(map[bool]string{false: "json", true: "stream"}[stream], func(t *testing.T) {
			url, p := replayingDoor(t, 0)
			key := map[string]string{frontdoor.HeaderIdempotencyKey: "action-e2e"}
			first := post(t, context.Background(), url, chatBody(stream, ""), key)
			firstBody := readAll(t, first)
			again := post(t, context.Background(), url, chatBody(stream, ""), key)
			againBody := readAll(t, again)
			if first.StatusCode != http.StatusOK || again.StatusCode != http.StatusOK || string(firstBody) != string(againBody) {
				t.Fatalf("first %d %q, retry %d %q", first.StatusCode, firstBody, again.StatusCode, againBody)
			}
			if again.Header.Get(frontdoor.HeaderIdempotentReplayed) != "true" || again.Header.Get(frontdoor.HeaderGate) == "" {
				t.Fatalf("retry headers %v", again.Header)
			}
			if n := len(p.Arrived()); n != 1 {
				t.Fatalf("the provider had %d requests; the retry must make none", n)
			}
		})
	}
}

func TestHTTPConcurrentTwinsShareOneAnswerAndOneProviderCall(t *testing.T) {
	url, p := replayingDoor(t, 300*time.Millisecond)
	const key = "action-twins"
	bodies := make([][]byte, 2)
	statuses := make([]int, 2)
	errs := make([]error, 2)
	// send is for the goroutines, which must not stop the test.
	send := func(i int) {
		req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(chatBody(true, "")))
		if err != nil {
			errs[i] = err
			return
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(frontdoor.HeaderIdempotencyKey, key)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			defer resp.Body.Close()
			statuses[i] = resp.StatusCode
			bodies[i], err = io.ReadAll(resp.Body)
		}
		errs[i] = err
	}
	var wg sync.WaitGroup
	wg.Go(func() { send(0) })
	// The first request is at the provider: its twin joins it (or, on a
	// slow machine, finds it committed; either way the same answer).
	select {
	case <-p.Arrived():
	case <-time.After(10 * time.Second):
		t.Fatal("the first request never reached the provider")
	}
	wg.Go(func() { send(1) })
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("requests: %v, %v", errs[0], errs[1])
	}
	if statuses[0] != http.StatusOK || statuses[1] != http.StatusOK || string(bodies[0]) != string(bodies[1]) {
		t.Fatalf("first %d %q, twin %d %q", statuses[0], bodies[0], statuses[1], bodies[1])
	}
	if n := len(p.Arrived()); n != 0 {
		t.Fatalf("the provider had %d more requests; the twin must make none", n)
	}
}

// redisReplica is one gateway replica over rs: a dispatcher whose budgets
// and winner gate are in Redis and an HTTP door whose replay store is
// there too, as internal/node assembles them.
func redisReplica(t *testing.T, c *dispatcher.TestCluster, rs *redistest.Server) string {
	t.Helper()
	return redisReplicaWith(t, c, rs, httpdoor.Options{})
}

// redisReplicaWith is redisReplica with its door's options (Replays is
// set here).
func redisReplicaWith(t *testing.T, c *dispatcher.TestCluster, rs *redistest.Server, opts httpdoor.Options) string {
	t.Helper()
	client := redis.NewClient(&redis.Options{Addr: rs.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	store, err := redisstore.New(client, redisstore.Options{Prefix: "twins", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	gate, err := sharedgate.NewRedisGate(client, sharedgate.RedisGateOptions{Prefix: "twins", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	replays, err := redisreplay.New(client, redisreplay.Options{Prefix: "twins", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	d := c.AddDispatcher(dispatcher.Options{Store: store, Gate: gate, Registerer: prometheus.NewRegistry(), Secret: []byte("replicas-share-it")})
	opts.Replays = replays
	return httpDoor(t, c, d, opts).URL
}

// A twin reaching another replica while the first request runs waits for
// its answer in the shared store and is replayed it: one provider call,
// the same bytes (docs/architecture.md §2).
func TestHTTPTwinOnAnotherReplicaJoinsTheFirstRequest(t *testing.T) {
	rs := redistest.Start(t)
	p := dispatcher.NewTestProvider(t, "a", dispatcher.NewTestScript(dispatcher.Late(500*time.Millisecond, 3)))
	c := dispatcher.NewTestCluster(t, []string{"a"}, map[string]*dispatcher.TestProvider{"a": p}, "")
	urls := []string{redisReplica(t, c, rs), redisReplica(t, c, rs)}
	for _, stream := range []bool{false, true} {
		t.Run(map[bool]string{false: "json", true: "stream"}[stream], func(t *testing.T) {
			key := map[string]string{frontdoor.HeaderIdempotencyKey: fmt.Sprintf("twins-%t", stream)}
			first := make(chan *http.Response, 1)
			go func() { first <- post(t, context.Background(), urls[0], chatBody(stream, ""), key) }()
			select {
			case <-p.Arrived():
			case <-time.After(10 * time.Second):
				t.Fatal("the first request never reached the provider")
			}
			twin := post(t, context.Background(), urls[1], chatBody(stream, ""), key)
			twinBody := readAll(t, twin)
			var resp *http.Response
			select {
			case resp = <-first:
			case <-time.After(10 * time.Second):
				t.Fatal("the first request never answered")
			}
			firstBody := readAll(t, resp)
			if resp.StatusCode != http.StatusOK || twin.StatusCode != http.StatusOK || string(firstBody) != string(twinBody) {
				t.Fatalf("first %d %q, twin %d %q; want one answer twice", resp.StatusCode, firstBody, twin.StatusCode, twinBody)
			}
			if twin.Header.Get(frontdoor.HeaderIdempotentReplayed) != "true" {
				t.Fatalf("twin headers %v; want it marked replayed", twin.Header)
			}
			if n := len(p.Arrived()); n != 0 {
				t.Fatalf("the provider had %d more requests; the twin must make none", n)
			}
		})
	}
}

// A caller that leaves a committed stream midway never got its answer: the
// door lapses the request's lease instead of releasing it, so the retry
// takes the request over at once, supersedes the commit and gets a
// complete answer — not 409 already_committed (docs/architecture.md §2).
func TestHTTPRetryAfterTheCallerLeftMidStreamGetsACompleteAnswer(t *testing.T) {
	p := dispatcher.NewTestProvider(t, "a", dispatcher.NewTestScript(dispatcher.Words(3), dispatcher.StallAfter(1)))
	c := dispatcher.NewTestCluster(t, []string{"a"}, map[string]*dispatcher.TestProvider{"a": p}, "")
	store, err := replay.NewMemory(replay.MemoryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	url := httpDoor(t, c, c.Dispatcher(), httpdoor.Options{Replays: store}).URL
	key := map[string]string{frontdoor.HeaderIdempotencyKey: "action-left"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := post(t, ctx, url, chatBody(true, ""), key)
	defer first.Body.Close()
	if first.StatusCode != http.StatusOK {
		t.Fatalf("first: %d", first.StatusCode)
	}
	frontdoortest.ReadUntil(t, first.Body, `"content":"a0 "`)
	cancel()
	dispatcher.WaitGone(t, p)

	retry := post(t, context.Background(), url, chatBody(true, ""), key)
	body := readAll(t, retry)
	if retry.StatusCode != http.StatusOK || !strings.HasSuffix(string(body), "data: [DONE]\n\n") || retry.Header.Get(frontdoor.HeaderIdempotentReplayed) != "" {
		t.Fatalf("retry: %d %q (replayed %q); want a complete stream, regenerated", retry.StatusCode, body, retry.Header.Get(frontdoor.HeaderIdempotentReplayed))
	}
	if n := len(p.Arrived()); n != 2 {
		t.Fatalf("the provider had %d requests; want the first one and the retry's", n)
	}
}

// An answer delivered whole but over http.idempotency.max_entry_bytes is
// not kept; its tombstone is, so a retry on either replica is refused 409
// answer_not_kept at once — naming that the answer was delivered and not
// kept, never retryable — and the provider hears of the user action once
// (docs/architecture.md §2).
func TestHTTPRetryOfAnAnswerTooLargeToKeepIsRefusedAtOnceWithNoProviderCall(t *testing.T) {
	rs := redistest.Start(t)
	p := dispatcher.NewTestProvider(t, "a", dispatcher.NewTestScript(dispatcher.Words(3)))
	c := dispatcher.NewTestCluster(t, []string{"a"}, map[string]*dispatcher.TestProvider{"a": p}, "")
	opts := httpdoor.Options{ReplayMaxBytes: 64} // every answer here is larger
	urls := []string{redisReplicaWith(t, c, rs, opts), redisReplicaWith(t, c, rs, opts)}
	for _, stream := range []bool{false, true} {
		t.Run(map[bool]string{false: "json", true: "stream"}[stream], func(t *testing.T) {
			key := map[string]string{frontdoor.HeaderIdempotencyKey: fmt.Sprintf("too-large-%t", stream)}
			first := post(t, context.Background(), urls[0], chatBody(stream, ""), key)
			if body := readAll(t, first); first.StatusCode != http.StatusOK || len(body) <= 64 {
				t.Fatalf("first: %d, %d bytes; want a 200 answer over the 64-byte bound", first.StatusCode, len(body))
			}
			waitArrivals(t, p, 1)
			for i, url := range append(urls, urls...) {
				start := time.Now()
				retry := post(t, context.Background(), url, chatBody(stream, ""), key)
				body := readAll(t, retry)
				took := time.Since(start)
				if retry.StatusCode != http.StatusConflict || !strings.Contains(string(body), `"code":"answer_not_kept"`) ||
					retry.Header.Get("X-Should-Retry") != "false" {
					t.Fatalf("retry %d: %d %q (X-Should-Retry %q); want 409 answer_not_kept, should-retry false", i, retry.StatusCode, body,
						retry.Header.Get("X-Should-Retry"))
				}
				t.Logf("retry %d on replica %d: 409 answer_not_kept in %v", i, i%2+1, took.Round(time.Microsecond))
			}
			if n := len(p.Arrived()); n != 0 {
				t.Fatalf("the provider had %d more requests; the retries must make none", n)
			}
		})
	}
}

// waitArrivals takes n requests' arrivals at p, failing after a bound.
func waitArrivals(t *testing.T, p *dispatcher.TestProvider, n int) {
	t.Helper()
	for range n {
		select {
		case <-p.Arrived():
		case <-time.After(10 * time.Second):
			t.Fatal("a request never reached the provider")
		}
	}
}
