package httpdoor

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/dispatcher"
	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/frontdoor/frontdoortest"
	"github.com/hedgerow/hedgerow/frontdoor/replay"
	"github.com/hedgerow/hedgerow/frontdoor/replay/replaytest"
	"github.com/hedgerow/hedgerow/internal/eventually"
)

// replayDoor serves script behind a door with a memory replay store on
// clock; it returns the door's handler too, to watch its flights.
func replayDoor(t *testing.T, script frontdoortest.Script, clock *replaytest.Clock, ttl time.Duration) (*httptest.Server, *frontdoortest.Submitter, *handler) {
	t.Helper()
	store, err := replay.NewMemory(replay.MemoryOptions{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	sub := frontdoortest.New(script)
	h, err := New(sub, Options{Pools: map[string][]string{"general": {"a", "b"}}, Replays: store, ReplayTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, sub, h.(*handler)
}

// answered posts body to path and reads the whole answer.
func answered(t *testing.T, url, path, body string, headers map[string]string) (*http.Response, []byte) {
	t.Helper()
	resp, data, err := send(url+path, body, headers)
	if err != nil {
		t.Fatal(err)
	}
	return resp, data
}

// send is answered for goroutines other than the test's, which must not
// stop the test: it returns the error.
func send(url, body string, headers map[string]string) (*http.Response, []byte, error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return resp, data, err
}

var committed = &dispatcher.Response{GroupID: "g-1", Content: "a0 a1 ", Attempts: 2, Hedged: true, Winner: 2, WinnerRoute: "b", Gate: "g-1/2/1"}

func TestRetryAfterCommitReplaysTheAnswerByteForByteWithoutSubmitting(t *testing.T) {
	for _, tc := range []struct {
		name, path, body string
	}{
		{"chat", "/v1/chat/completions", chatBody(false, "")},
		{"chat stream", "/v1/chat/completions", chatBody(true, `"stream_options":{"include_usage":true}`)},
		{"messages", "/v1/messages", messagesRequest(false, "")},
		{"messages stream", "/v1/messages", messagesRequest(true, "")},
		{"responses stream", "/v1/responses", `{"model":"general","input":"hi","stream":true}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, sub, _ := replayDoor(t, frontdoortest.Answer(committed, false,
				dispatcher.Delta{Content: "a0 "}, dispatcher.Delta{Content: "a1 "}), replaytest.NewClock(), 0)
			key := map[string]string{frontdoor.HeaderIdempotencyKey: "action-1"}
			first, firstBody := answered(t, srv.URL, tc.path, tc.body, key)
			again, againBody := answered(t, srv.URL, tc.path, tc.body, key)
			if first.StatusCode != http.StatusOK || again.StatusCode != http.StatusOK {
				t.Fatalf("statuses %d, %d", first.StatusCode, again.StatusCode)
			}
			if string(firstBody) != string(againBody) {
				t.Fatalf("replay differs:\n%s\nfirst:\n%s", againBody, firstBody)
			}
			if n := len(sub.Submissions()); n != 1 {
				t.Fatalf("%d submissions; the retry must replay, not submit", n)
			}
			if first.Header.Get(frontdoor.HeaderIdempotentReplayed) != "" || again.Header.Get(frontdoor.HeaderIdempotentReplayed) != "true" {
				t.Fatalf("Idempotent-Replayed %q then %q", first.Header.Get(frontdoor.HeaderIdempotentReplayed), again.Header.Get(frontdoor.HeaderIdempotentReplayed))
			}
			for _, name := range []string{"Content-Type", frontdoor.HeaderGate, frontdoor.HeaderWinnerRoute, frontdoor.HeaderAttempts, frontdoor.HeaderHedged} {
				want := first.Header.Get(name)
				if want == "" {
					want = first.Trailer.Get(name) // a stream whose commit came after its first byte
				}
				if got := again.Header.Get(name); got != want || got == "" {
					t.Errorf("replayed %s = %q; first answer %q", name, got, want)
				}
			}
		})
	}
}

func TestKeyReusedWithAnotherRequestIsRefused(t *testing.T) {
	srv, sub, _ := replayDoor(t, frontdoortest.Answer(committed, false), replaytest.NewClock(), 0)
	key := map[string]string{frontdoor.HeaderIdempotencyKey: "action-1"}
	if resp, _ := answered(t, srv.URL, "/v1/chat/completions", chatBody(false, ""), key); resp.StatusCode != http.StatusOK {
		t.Fatalf("first: %d", resp.StatusCode)
	}
	for _, tc := range []struct{ name, path, body string }{
		{"another body", "/v1/chat/completions", chatBody(false, `"temperature":0.5`)},
		{"a stream of the same body", "/v1/chat/completions", chatBody(true, "")},
		{"another dialect", "/v1/messages", messagesRequest(false, "")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := answered(t, srv.URL, tc.path, tc.body, key)
			if resp.StatusCode != http.StatusConflict || resp.Header.Get(frontdoor.HeaderShouldRetry) != "false" {
				t.Fatalf("status %d, X-Should-Retry %q; want 409, false", resp.StatusCode, resp.Header.Get(frontdoor.HeaderShouldRetry))
			}
			if tc.path == "/v1/chat/completions" {
				if _, code, param := openAIErrorOf(t, body); code != frontdoor.CodeIdempotencyKeyReused || param != frontdoor.HeaderIdempotencyKey {
					t.Fatalf("code %q param %q", code, param)
				}
			}
		})
	}
	if n := len(sub.Submissions()); n != 1 {
		t.Fatalf("%d submissions; a reused key must not submit", n)
	}
	other := map[string]string{frontdoor.HeaderIdempotencyKey: "action-2"}
	if resp, _ := answered(t, srv.URL, "/v1/chat/completions", chatBody(false, `"temperature":0.5`), other); resp.StatusCode != http.StatusOK {
		t.Fatalf("a new key: %d", resp.StatusCode)
	}
}

func TestCommittedAnswerExpiresAfterItsTTL(t *testing.T) {
	clock := replaytest.NewClock()
	srv, sub, _ := replayDoor(t, frontdoortest.Answer(committed, false), clock, time.Hour)
	key := map[string]string{frontdoor.HeaderIdempotencyKey: "action-1"}
	post := func() *http.Response {
		resp, _ := answered(t, srv.URL, "/v1/chat/completions", chatBody(false, ""), key)
		return resp
	}
	post()
	clock.Advance(time.Hour - time.Millisecond)
	if resp := post(); resp.Header.Get(frontdoor.HeaderIdempotentReplayed) != "true" || len(sub.Submissions()) != 1 {
		t.Fatalf("before the TTL: replayed %q, %d submissions", resp.Header.Get(frontdoor.HeaderIdempotentReplayed), len(sub.Submissions()))
	}
	clock.Advance(time.Millisecond)
	if resp := post(); resp.Header.Get(frontdoor.HeaderIdempotentReplayed) != "" || len(sub.Submissions()) != 2 {
		t.Fatalf("at the TTL: replayed %q, %d submissions; want a new try", resp.Header.Get(frontdoor.HeaderIdempotentReplayed), len(sub.Submissions()))
	}
}

func TestFailedAnswerIsNotReplayed(t *testing.T) {
	srv, sub, _ := replayDoor(t, frontdoortest.Fail(&dispatcher.GroupError{Code: "all_routes_failed"}), replaytest.NewClock(), 0)
	key := map[string]string{frontdoor.HeaderIdempotencyKey: "action-1"}
	for range 2 {
		resp, _ := answered(t, srv.URL, "/v1/chat/completions", chatBody(false, ""), key)
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get(frontdoor.HeaderShouldRetry) != "true" {
			t.Fatalf("status %d, X-Should-Retry %q", resp.StatusCode, resp.Header.Get(frontdoor.HeaderShouldRetry))
		}
	}
	if n := len(sub.Submissions()); n != 2 {
		t.Fatalf("%d submissions; a retry after a failure is a new try", n)
	}
}

// A request of a key in flight waits for it and gets its answer; one of
// another request under the key is refused at once.
func TestConcurrentTwinJoinsTheRequestInFlight(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(map[bool]string{false: "json", true: "stream"}[stream], func(t *testing.T) {
			release := make(chan struct{})
			answer := frontdoortest.Answer(committed, true, dispatcher.Delta{Content: "a0 "}, dispatcher.Delta{Content: "a1 "})
			srv, sub, h := replayDoor(t, func(ctx context.Context, s dispatcher.Submission, sink dispatcher.Sink) (*dispatcher.Response, error) {
				<-release
				return answer(ctx, s, sink)
			}, replaytest.NewClock(), 0)
			key := map[string]string{frontdoor.HeaderIdempotencyKey: "action-1"}
			// A failing test must not leave the handlers blocked: the
			// server's Close (a cleanup registered earlier) waits for them.
			var once sync.Once
			free := func() { once.Do(func() { close(release) }) }
			t.Cleanup(free)
			type result struct {
				resp *http.Response
				body []byte
				err  error
			}
			results := make([]result, 2)
			var wg sync.WaitGroup
			wg.Go(func() {
				results[0].resp, results[0].body, results[0].err = send(srv.URL+"/v1/chat/completions", chatBody(stream, ""), key)
			})
			eventually.True(t, 5*time.Second, "the first request submitted", func() bool { return len(sub.Submissions()) == 1 })
			wg.Go(func() {
				results[1].resp, results[1].body, results[1].err = send(srv.URL+"/v1/chat/completions", chatBody(stream, ""), key)
			})
			rk := replay.Key("", "action-1")
			eventually.True(t, 5*time.Second, "the twin joined", func() bool { return h.flights.Joined(rk) == 1 })

			resp, body := answered(t, srv.URL, "/v1/chat/completions", chatBody(stream, `"temperature":0.1`), key)
			if _, code, _ := openAIErrorOf(t, body); resp.StatusCode != http.StatusConflict || code != frontdoor.CodeIdempotencyKeyReused {
				t.Fatalf("another request under the key in flight: %d %s", resp.StatusCode, code)
			}
			free()
			wg.Wait()
			if results[0].err != nil || results[1].err != nil {
				t.Fatalf("requests: %v, %v", results[0].err, results[1].err)
			}
			if results[0].resp.StatusCode != http.StatusOK || string(results[0].body) != string(results[1].body) {
				t.Fatalf("twin got %d %q; first %d %q", results[1].resp.StatusCode, results[1].body, results[0].resp.StatusCode, results[0].body)
			}
			if results[1].resp.Header.Get(frontdoor.HeaderIdempotentReplayed) != "true" {
				t.Fatal("the twin's answer is not marked replayed")
			}
			if n := len(sub.Submissions()); n != 1 {
				t.Fatalf("%d submissions; the twin must not submit", n)
			}
		})
	}
}

// A twin of a request that fails runs as a new try.
func TestTwinOfAFailedRequestRunsAgain(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	calls := 0
	srv, sub, h := replayDoor(t, func(ctx context.Context, s dispatcher.Submission, sink dispatcher.Sink) (*dispatcher.Response, error) {
		mu.Lock()
		calls++
		n := calls
		mu.Unlock()
		if n == 1 {
			<-release
			return nil, &dispatcher.GroupError{Code: "all_routes_failed"}
		}
		return committed, nil
	}, replaytest.NewClock(), 0)
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free) // before the server's Close, which waits for the handlers
	key := map[string]string{frontdoor.HeaderIdempotencyKey: "action-1"}
	var wg sync.WaitGroup
	var first, twin *http.Response
	var firstErr, twinErr error
	wg.Go(func() { first, _, firstErr = send(srv.URL+"/v1/chat/completions", chatBody(false, ""), key) })
	eventually.True(t, 5*time.Second, "the first request submitted", func() bool { return len(sub.Submissions()) == 1 })
	wg.Go(func() { twin, _, twinErr = send(srv.URL+"/v1/chat/completions", chatBody(false, ""), key) })
	eventually.True(t, 5*time.Second, "the twin joined", func() bool { return h.flights.Joined(replay.Key("", "action-1")) == 1 })
	free()
	wg.Wait()
	if firstErr != nil || twinErr != nil {
		t.Fatalf("requests: %v, %v", firstErr, twinErr)
	}
	if first.StatusCode != http.StatusServiceUnavailable || twin.StatusCode != http.StatusOK || len(sub.Submissions()) != 2 {
		t.Fatalf("first %d, twin %d, %d submissions", first.StatusCode, twin.StatusCode, len(sub.Submissions()))
	}
}

// orphanDoor is a replay door whose store holds, under key action-1, the
// in-flight marker of the same chat request from dispatcher d-dead, never
// refreshed; the request's fingerprint is learnt from a first answer under
// another key (a fingerprint does not depend on the key).
func orphanDoor(t *testing.T) (*httptest.Server, *frontdoortest.Submitter, *replaytest.Clock) {
	t.Helper()
	clock := replaytest.NewClock()
	srv, sub, h := replayDoor(t, frontdoortest.Answer(committed, false), clock, time.Hour)
	answered(t, srv.URL, "/v1/chat/completions", chatBody(false, ""), map[string]string{frontdoor.HeaderIdempotencyKey: "probe"})
	probe, err := h.opts.Replays.Get(t.Context(), replay.Key("", "probe"))
	if err != nil || probe == nil {
		t.Fatalf("the probe's answer: %v, %v", probe, err)
	}
	dead := replay.Marker{Fingerprint: probe.Fingerprint, Owner: "d-dead", Token: "t"}
	if c, err := h.opts.Replays.Claim(t.Context(), replay.Key("", "action-1"), dead, replay.DefaultLease); err != nil || !c.Won {
		t.Fatalf("the dead gateway's claim: %+v, %v", c, err)
	}
	return srv, sub, clock
}

// A request whose lease lapsed with no answer (its gateway died) is taken
// over: the retry submits, naming the orphaned request's group in Supersedes.
func TestRetryOfAnOrphanedRequestSupersedesItsGroup(t *testing.T) {
	srv, sub, clock := orphanDoor(t)
	clock.Advance(replay.DefaultLease)
	resp, body := answered(t, srv.URL, "/v1/chat/completions", chatBody(false, ""), map[string]string{frontdoor.HeaderIdempotencyKey: "action-1"})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the retry: %d %s", resp.StatusCode, body)
	}
	subs := sub.Submissions()
	if len(subs) != 2 || subs[1].Supersedes != "d-dead" {
		t.Fatalf("submissions %+v; want the retry's superseding d-dead", subs)
	}
}

// A twin waiting on a live lease of another replica waits no longer than
// its caller's deadline: 504 deadline_exceeded, nothing submitted.
func TestTwinWaitingPastItsCallersDeadlineIsAnsweredDeadlineExceeded(t *testing.T) {
	srv, sub, _ := orphanDoor(t)
	resp, body := answered(t, srv.URL, "/v1/chat/completions", chatBody(false, ""),
		map[string]string{frontdoor.HeaderIdempotencyKey: "action-1", frontdoor.HeaderDeadlineMs: "200"})
	if _, code, _ := openAIErrorOf(t, body); resp.StatusCode != http.StatusGatewayTimeout || code != "deadline_exceeded" {
		t.Fatalf("the twin: %d %s; want 504 deadline_exceeded", resp.StatusCode, body)
	}
	if n := len(sub.Submissions()); n != 1 {
		t.Fatalf("%d submissions; the waiting twin must submit none", n)
	}
}
