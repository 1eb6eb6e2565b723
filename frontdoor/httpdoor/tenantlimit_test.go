package httpdoor

import (
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/budgets/slice"
	"github.com/hedgerow/hedgerow/budgets/slice/slicetest"
	"github.com/hedgerow/hedgerow/dispatcher"
	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/frontdoor/frontdoortest"
	"github.com/hedgerow/hedgerow/frontdoor/tenantlimit"
	"github.com/hedgerow/hedgerow/internal/eventually"
)

// limitWait bounds every wait for what the door does as soon as the test
// acts; reaching it is a failure.
const limitWait = 10 * time.Second

// limitedDialects are both dialects' chat paths, with the body and the
// error type each answers a tenant limit with.
var limitedDialects = []limitedDialect{
	{"openai", "/v1/chat/completions", chatBody(false, ""), "rate_limit_error",
		func(t testing.TB, body []byte) string { typ, _, _ := openAIErrorOf(t, body); return typ }},
	{"anthropic", "/v1/messages", messagesRequest(false, ""), "rate_limit_error", frontdoortest.AnthropicErrorType},
}

type limitedDialect struct {
	name, path, body, typ string
	errType               func(t testing.TB, body []byte) string
}

// code is the error code the dialect's error object carries: Anthropic's
// has none.
func (d limitedDialect) code(c string) string {
	if d.name == "anthropic" {
		return ""
	}
	return c
}

// limitedOptions is a door with tenants acme (limited by limit) and other,
// on one gateway's slices on clock.
func limitedOptions(t *testing.T, limit tenantlimit.Limit, clock *frontdoortest.SettableClock) (Options, *tenantlimit.Limiter) {
	t.Helper()
	keys, l := frontdoortest.TenantLimits(t, limit, slicetest.Slices(t, slice.NewMemory(clock.Now), clock.Now))
	return Options{Keyring: keys, Limiter: l}, l
}

func withKey(key string) map[string]string {
	return map[string]string{"Authorization": "Bearer " + key, "Content-Type": "application/json"}
}

// wantRefused checks a tenant-limit refusal: 429, the error type, the
// code (OpenAI dialect; "" for Anthropic's, which has none) and the retry
// hints.
func wantRefused(t *testing.T, resp *http.Response, body []byte, code, typ, retryAfter string, errType func(testing.TB, []byte) string) {
	t.Helper()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429: %s", resp.StatusCode, body)
	}
	if got := errType(t, body); got != typ {
		t.Errorf("error type %q, want %q", got, typ)
	}
	if code != "" {
		if _, c, _ := openAIErrorOf(t, body); c != code {
			t.Errorf("code %q, want %q", c, code)
		}
	}
	if resp.Header.Get("Retry-After") != retryAfter || resp.Header.Get(frontdoor.HeaderShouldRetry) != "true" {
		t.Errorf("Retry-After %q, %s %q; want %s and true", resp.Header.Get("Retry-After"), frontdoor.HeaderShouldRetry,
			resp.Header.Get(frontdoor.HeaderShouldRetry), retryAfter)
	}
}

func TestHTTPBothDialectsRateLimitATenantThenAdmitItAfterTheRefill(t *testing.T) {
	for _, dl := range limitedDialects {
		t.Run(dl.name, func(t *testing.T) {
			clock := frontdoortest.NewSettableClock()
			opts, _ := limitedOptions(t, tenantlimit.Limit{RequestsPerSecond: 0.25, Burst: 2}, clock)
			srv, sub := scripted(t, frontdoortest.Answer(&dispatcher.Response{Content: "ok"}, false), opts)
			for i := range 2 {
				if resp, body := frontdoortest.Do(t, http.MethodPost, srv.URL+dl.path, dl.body, withKey(frontdoortest.AcmeKey)); resp.StatusCode != 200 {
					t.Fatalf("request %d of the burst: %d %s", i+1, resp.StatusCode, body)
				}
			}
			resp, body := frontdoortest.Do(t, http.MethodPost, srv.URL+dl.path, dl.body, withKey(frontdoortest.AcmeKey))
			wantRefused(t, resp, body, dl.code(frontdoor.CodeTenantRateLimited), dl.typ, "4", dl.errType)
			if resp, body := frontdoortest.Do(t, http.MethodPost, srv.URL+dl.path, dl.body, withKey(frontdoortest.OtherKey)); resp.StatusCode != 200 {
				t.Fatalf("another tenant refused for acme's rate: %d %s", resp.StatusCode, body)
			}
			if n := len(sub.Submissions()); n != 3 {
				t.Fatalf("%d submissions, want 3: the refused request ran nothing", n)
			}
			clock.Advance(4 * time.Second)
			if resp, body := frontdoortest.Do(t, http.MethodPost, srv.URL+dl.path, dl.body, withKey(frontdoortest.AcmeKey)); resp.StatusCode != 200 {
				t.Fatalf("request after the refill: %d %s", resp.StatusCode, body)
			}
		})
	}
}

// slotFree reports whether acme has a slot free, without keeping it.
func slotFree(l *tenantlimit.Limiter) func() bool {
	return func() bool { return frontdoortest.SlotsFree(l, 1) }
}

func TestHTTPBothDialectsRefuseATenantsRequestOverItsConcurrencyUntilOneEnds(t *testing.T) {
	for _, dl := range limitedDialects {
		t.Run(dl.name, func(t *testing.T) {
			opts, limiter := limitedOptions(t, tenantlimit.Limit{MaxConcurrent: 2}, frontdoortest.NewSettableClock())
			arrived, gone, release := make(chan struct{}, 4), make(chan struct{}, 4), make(chan struct{})
			srv, _ := scripted(t, func(ctx context.Context, sub dispatcher.Submission, sink dispatcher.Sink) (*dispatcher.Response, error) {
				arrived <- struct{}{}
				select {
				case <-release:
					return &dispatcher.Response{Content: "ok"}, nil
				case <-ctx.Done():
					gone <- struct{}{}
					return nil, ctx.Err()
				}
			}, opts)
			// Two requests hold acme's two slots: one to be answered,
			// one whose caller leaves.
			send := func(ctx context.Context) int {
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+dl.path, strings.NewReader(dl.body))
				if err != nil {
					return 0
				}
				for k, v := range withKey(frontdoortest.AcmeKey) {
					req.Header.Set(k, v)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return 0
				}
				resp.Body.Close()
				return resp.StatusCode
			}
			answeredCh := make(chan int, 1)
			go func() { answeredCh <- send(context.Background()) }()
			ctx, leave := context.WithCancel(context.Background())
			defer leave()
			leftCh := make(chan struct{})
			go func() {
				defer close(leftCh)
				send(ctx)
			}()
			for range 2 {
				select {
				case <-arrived:
				case <-time.After(limitWait):
					t.Fatal("a request never reached the runtime")
				}
			}
			resp, body := frontdoortest.Do(t, http.MethodPost, srv.URL+dl.path, dl.body, withKey(frontdoortest.AcmeKey))
			wantRefused(t, resp, body, dl.code(frontdoor.CodeTenantConcurrencyLimited), dl.typ, "1", dl.errType)

			leave() // the caller goes away: its slot is freed
			eventually.Closed(t, limitWait, "the leaving caller's request ended", leftCh)
			select {
			case <-gone:
			case <-time.After(limitWait):
				t.Fatal("the submission of the caller that left never ended")
			}
			eventually.True(t, limitWait, "a slot freed after its caller left", slotFree(limiter))

			close(release) // the other is answered: its slot is freed too
			select {
			case status := <-answeredCh:
				if status != 200 {
					t.Fatalf("the held request answered %d", status)
				}
			case <-time.After(limitWait):
				t.Fatal("the held request was never answered")
			}
			eventually.True(t, limitWait, "both slots freed", func() bool {
				return frontdoortest.SlotsFree(limiter, 2)
			})
		})
	}
}

// A request whose serving panics (http.Server recovers it) frees its slot.
func TestHTTPARequestThatPanicsFreesItsTenantSlot(t *testing.T) {
	opts, limiter := limitedOptions(t, tenantlimit.Limit{MaxConcurrent: 1}, frontdoortest.NewSettableClock())
	opts.Pools = map[string][]string{"general": {"a"}}
	h, err := New(frontdoortest.New(func(context.Context, dispatcher.Submission, dispatcher.Sink) (*dispatcher.Response, error) {
		panic("the runtime broke")
	}), opts)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the recovered panic's stack
	srv.Start()
	t.Cleanup(srv.Close)
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(chatBody(false, "")))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+frontdoortest.AcmeKey)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("a panicking request answered %d", resp.StatusCode)
	}
	eventually.True(t, limitWait, "the panicking request's slot freed", slotFree(limiter))
}

// A caller at its tenant's concurrency limit that sends each request once it
// has read the whole answer of the last is admitted every time, on both
// dialects, streaming or not: the slot is freed before the handler returns,
// so before the answer's last bytes leave.
func TestHTTPAdmitsSequentialRequestsAtTheConcurrencyLimit(t *testing.T) {
	opts, _ := limitedOptions(t, tenantlimit.Limit{MaxConcurrent: 1}, frontdoortest.NewSettableClock())
	srv, _ := scripted(t, frontdoortest.Answer(&dispatcher.Response{Content: "ok", FinishReason: "stop"}, true, dispatcher.Delta{Content: "ok"}), opts)
	for _, tc := range []struct{ path, body string }{
		{"/v1/chat/completions", chatBody(false, "")}, {"/v1/chat/completions", chatBody(true, "")},
		{"/v1/messages", messagesRequest(false, "")}, {"/v1/messages", messagesRequest(true, "")},
	} {
		for i := range 10 {
			if resp, body := frontdoortest.Do(t, http.MethodPost, srv.URL+tc.path, tc.body, withKey(frontdoortest.AcmeKey)); resp.StatusCode != 200 {
				t.Fatalf("%s request %d: %d %s", tc.path, i+1, resp.StatusCode, body)
			}
		}
	}
}
